// The one exception type of the core's C++ API.
//
// Every error a user can cause (bad input, bad options, a plugin that cannot serve) is a
// polyprobe::Error whose message names what and where and, when there is one, how to fix
// it. The host app prints the message on one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace polyprobe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace polyprobe
