# cmake -DNM=nm -DOBJECTS="a.o;b.o" -P kernel_symbols.cmake
# impl's kernel objects (one compilation per instruction set, impl/isa.h) must define no weak code
# outside their own namespace: the linker keeps one copy of a weak symbol for the whole program,
# so an inline function or template instantiated in the AVX-512 compilation could be what a
# baseline caller on an AVX2-only CPU runs (SIGILL). Weak symbols inside kvdiff::impl::<isa>:: are
# distinct per compilation (FoldLanes<32> at -O0), and typeinfo (UBSan's, for function types) is
# data, not code; both are allowed.
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE symbols
                  RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REGEX MATCHALL "[^\n]* [WVu] [^\n]*" weak "${symbols}")
  set(shared)
  foreach(line IN LISTS weak)
    if(NOT line MATCHES " kvdiff::impl::(scalar|avx2|avx512)::" AND NOT line MATCHES " V typeinfo")
      list(APPEND shared "${line}")
    endif()
  endforeach()
  if(shared)
    string(REPLACE ";" "\n  " shared "${shared}")
    message(FATAL_ERROR "${object} defines symbols the linker may merge across instruction "
                        "sets:\n  ${shared}")
  endif()
  string(REGEX MATCHALL " [TD] [^\n]*" strong "${symbols}")
  list(LENGTH strong count)
  message(STATUS "${object}: ${count} global symbols, none shared")
endforeach()
