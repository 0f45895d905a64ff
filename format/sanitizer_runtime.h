// KVDIFF_SANITIZER_RUNTIME is defined when this translation unit is built for a sanitizer whose
// runtime replaces malloc and reserves shadow memory (AddressSanitizer, ThreadSanitizer,
// MemorySanitizer; gcc and clang spell the test differently). Code that talks to glibc's allocator
// or limits the address space asks here.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVDIFF_SANITIZER_RUNTIME 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define KVDIFF_SANITIZER_RUNTIME 1
#endif
#endif
