# cmake -DNM=nm -DOBJECTS="a.o;b.o" -P kernel_symbols.cmake
# impl's kernel objects (one compilation per instruction set, impl/isa.h) must define no weak or
# unique symbol: the linker keeps one copy of such a symbol for the whole program, so an inline
# function or template instantiated in the AVX-512 compilation could be what a baseline caller on
# an AVX2-only CPU runs (SIGILL). Their own functions live in their own namespaces and are strong.
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE symbols
                  RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REGEX MATCHALL "[^\n]* [WVu] [^\n]*" shared "${symbols}")
  if(shared)
    string(REPLACE ";" "\n  " shared "${shared}")
    message(FATAL_ERROR "${object} defines symbols the linker may merge across instruction "
                        "sets:\n  ${shared}")
  endif()
  string(REGEX MATCHALL " [TD] [^\n]*" strong "${symbols}")
  list(LENGTH strong count)
  message(STATUS "${object}: ${count} global symbols, none weak")
endforeach()
