// Typed errors shared by every kvdiff library. Libraries throw; only main() turns an exception into
// a message and an exit code (InputError -> 2).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvdiff {

// Bad input from the user: a malformed file, a wrong shape, a token out of range, an impossible
// config, a misused API. The message says what was expected and what was found.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor shape that does not fit an operation, reported the way candle reports it
// ("cannot broadcast [5, 5] to [1, 9, 5, 29]"). Raised by the unchecked candle-style call.
class ShapeError : public InputError {
 public:
  using InputError::InputError;
};

// An outside engine (a plugin) failed on input it accepted: out of memory, an internal error. Not
// the user's fault, so not an InputError: main() reports it as a failure (exit 1).
class EngineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An engine in another process that did not answer a call within its time-out (--isolate-timeout):
// it was killed, and the backend calls it no more, since a new process would most likely hang
// as long again. A replay stops that backend for the rest of the scenario, and a campaign does
// not shrink such a case (each candidate would wait for the time-out).
class EngineHungError : public EngineError {
 public:
  using EngineError::EngineError;
};

}  // namespace kvdiff

// KVDIFF_CHECK(cond, "fmt {}", args...): argument check at an API boundary; throws InputError.
#define KVDIFF_CHECK(cond, ...)                                        \
  do {                                                                 \
    if (!(cond)) throw ::kvdiff::InputError(fmt::format(__VA_ARGS__)); \
  } while (0)
