// Helpers of the spec tests that check errors.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <typeinfo>

namespace partita::spec {

// The message of the E that f throws; a failure if it throws nothing or
// something else.
template <typename E, typename F>
std::string raised(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got " << typeid(e).name() << ": "
                  << e.what();
    return "";
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", nothing was thrown";
  return "";
}

}  // namespace partita::spec

// Evaluates `text` once: it may be a collective call.
#define EXPECT_CONTAINS(text, part)                                                   \
  do {                                                                                \
    const std::string text_once_ = (text);                                            \
    EXPECT_NE(text_once_.find(part), std::string::npos)                               \
        << "'" << text_once_ << "' lacks '" << (part) << "'";                         \
  } while (0)
