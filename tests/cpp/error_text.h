// Test helper: the message of the c10::Error a callable throws ("" when it throws none).
#pragma once

#include <c10/util/Exception.h>

#include <string>

namespace speedtorch::testing {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace speedtorch::testing
