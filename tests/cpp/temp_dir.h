// Test helper: a fresh temporary directory per test, removed with everything in it afterwards. Plain POSIX calls:
// std::filesystem may resolve to another libstdc++ copy exported by libtorch in these test binaries.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace speedtorch::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/speedtorch-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const std::string& name : names()) ::unlink(path(name).c_str());
    ::rmdir(dir_.c_str());
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // The files in the directory (to check that no temporary is left behind).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    DIR* d = opendir(dir_.c_str());
    if (d == nullptr) return out;
    while (const dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    closedir(d);
    return out;
  }
  std::size_t file_count() const { return names().size(); }
  static void write_bytes(const std::string& file, const std::string& bytes) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string read_bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::string dir_;
};

}  // namespace speedtorch::testing
