// Tests for csrc/io/npy_file: the .npy header codec, its validation, and chunked atomic streaming of tensors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "error_text.h"
#include "io/content_hash.h"
#include "io/npy_file.h"
#include "temp_dir.h"

namespace speedtorch::io {
namespace {

using speedtorch::testing::error_of;

class NpyFile : public speedtorch::testing::TempDirTest {};

// Random values of any dtype (never all zeros).
at::Tensor random_tensor(at::IntArrayRef shape, c10::ScalarType dtype) {
  if (dtype == at::kBool) return at::randint(0, 2, shape, at::kLong).to(at::kBool);
  if (at::isFloatingType(dtype)) return at::randn(shape).to(dtype);
  const int64_t high = dtype == at::kByte ? 255 : dtype == at::kChar ? 127 : 30000;
  return at::randint(dtype == at::kByte ? 0 : -high, high, shape, at::kLong).to(dtype);
}

// A file made of a header dict text (padded as NumPy does) and `data_bytes` bytes of data.
std::string npy_bytes(const std::string& dict, std::size_t data_bytes, int version = 1) {
  std::string text = dict;
  const std::size_t preamble = version == 1 ? 10 : 12;
  text.append((64 - (preamble + text.size() + 1) % 64) % 64, ' ');
  text.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(version));
  out.push_back(0);
  for (std::size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
  return out + text + std::string(data_bytes, '\x01');
}

TEST_F(NpyFile, HeaderIsNumpysAndParsesBack) {
  const std::string h = encode_npy_header(at::kFloat, {3, 4});
  EXPECT_EQ(h.size() % 64, 0u);
  EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_NE(h.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"), std::string::npos);
  EXPECT_EQ(h.back(), '\n');
  for (const auto& shape : std::vector<std::vector<int64_t>>{{}, {7}, {0, 5}, {2, 3, 4}, {123456789, 128}}) {
    for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kLong, at::kByte, at::kBool}) {
      const std::string bytes = encode_npy_header(dtype, shape);
      const NpyHeader parsed = parse_npy_header(bytes.data(), bytes.size(), "test");
      EXPECT_EQ(parsed.shape, shape);
      EXPECT_EQ(parsed.dtype, dtype == at::kBFloat16 ? at::kUInt16 : dtype);
      EXPECT_EQ(parsed.data_offset, static_cast<int64_t>(bytes.size()));
    }
  }
  EXPECT_NE(encode_npy_header(at::kFloat, {7}).find("'shape': (7,)"), std::string::npos);
  EXPECT_NE(encode_npy_header(at::kFloat, {}).find("'shape': ()"), std::string::npos);
}

TEST_F(NpyFile, RoundTripEveryDtypeAndShape) {
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kLong, at::kInt, at::kShort,
                           at::kChar, at::kByte, at::kBool}) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{{37, 5}, {11}, {}, {4, 3, 2}, {0, 6}}) {
      const at::Tensor t = random_tensor(shape, dtype);
      const std::string file = path("t.npy");
      save_npy(t, file);
      for (const bool pinned : {true, false}) {
        const at::Tensor back = load_npy(file, pinned);
        ASSERT_EQ(back.sizes(), t.sizes());
        if (dtype == at::kBFloat16) {
          EXPECT_EQ(back.scalar_type(), at::kUInt16);  // NumPy has no bfloat16: raw bits
          EXPECT_TRUE(at::equal(back.view(at::kShort), t.view(at::kShort)));
        } else {
          EXPECT_EQ(back.scalar_type(), dtype);
          EXPECT_TRUE(at::equal(back, t)) << dtype << " " << t.sizes();
        }
      }
      at::Tensor into = at::empty_like(t);
      load_npy_into(into, file);
      EXPECT_TRUE(at::equal(into, t));  // bfloat16 included: '<u2' bits go back into a bfloat16 tensor
    }
  }
  EXPECT_EQ(file_count(), 1u);  // no temporaries left
}

TEST_F(NpyFile, ChunksThroughStridedSourcesAndDestinations) {
  // Rows with a stride (a table whose optimizer state sits beside each row) go through the staging buffer.
  const at::Tensor records = at::randn({1000, 24});
  const at::Tensor rows = records.narrow(1, 0, 16);
  const std::string file = path("rows.npy");
  NpyWriter writer(file, at::kFloat, {1000, 16}, /*chunk_bytes=*/1000);
  writer.write(rows.narrow(0, 0, 333));
  writer.write(rows.narrow(0, 333, 667));
  const uint64_t hash = writer.finish();
  writer.commit();
  ContentHasher expected;
  const at::Tensor dense = rows.contiguous();
  expected.update(dense.data_ptr(), static_cast<std::size_t>(dense.nbytes()));
  EXPECT_EQ(hash, expected.digest());

  at::Tensor dst_records = at::full({1000, 24}, 7.0);
  at::Tensor dst = dst_records.narrow(1, 4, 16);
  NpyReader reader(file, /*chunk_bytes=*/700);
  reader.read(dst.narrow(0, 0, 10));
  reader.read(dst.narrow(0, 10, 990));
  EXPECT_EQ(reader.hash(), hash);
  EXPECT_TRUE(at::equal(dst, rows));
  EXPECT_TRUE(at::equal(dst_records.narrow(1, 0, 4), at::full({1000, 4}, 7.0)));  // neighbours untouched
  EXPECT_TRUE(at::equal(dst_records.narrow(1, 20, 4), at::full({1000, 4}, 7.0)));
}

TEST_F(NpyFile, ConvertsFloatingTypesOnLoadAndRefusesOthers) {
  const at::Tensor t = at::randn({20, 3}, at::kDouble);
  save_npy(t, path("d.npy"));
  at::Tensor f = at::empty({20, 3});
  load_npy_into(f, path("d.npy"));
  EXPECT_TRUE(at::allclose(f, t.to(at::kFloat)));
  at::Tensor half = at::empty({20, 3}, at::kHalf);
  load_npy_into(half, path("d.npy"));
  EXPECT_TRUE(at::allclose(half.to(at::kFloat), t.to(at::kFloat), 1e-2, 1e-2));

  save_npy(at::randint(0, 9, {20, 3}, at::kLong), path("i.npy"));
  EXPECT_NE(error_of([&] { load_npy_into(f, path("i.npy")); }).find("cannot be loaded into a Float tensor"),
            std::string::npos);
  at::Tensor wrong_shape = at::empty({21, 3});
  EXPECT_NE(error_of([&] { load_npy_into(wrong_shape, path("d.npy")); }).find("holds an array of shape [20, 3]"),
            std::string::npos);
}

TEST_F(NpyFile, ValidatesHeadersWithClearErrors) {
  const auto check = [&](const std::string& bytes, const std::string& expected) {
    write_bytes(path("bad.npy"), bytes);
    const std::string err = error_of([&] { read_npy_header(path("bad.npy")); });
    EXPECT_NE(err.find(expected), std::string::npos) << "got: " << err;
  };
  check("PK\x03\x04 not numpy at all", "not a .npy file");
  check("\x93NU", "too short");
  check(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", 60), "is truncated");
  check(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", 68), "bytes after the data");
  check(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", 16), "big-endian");
  check(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16), "Fortran");
  check(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8), "structured");
  check(npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16), "unsupported dtype '<c8'");
  check(npy_bytes("{'descr': '<f4', 'shape': (2,), }", 8), "lacks one of");
  check(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", 8), "non-negative integers");
  std::string v9 = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  v9[6] = 9;
  check(v9, "unsupported .npy format version 9.0");
  std::string cut = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 0);
  check(cut.substr(0, 30), "truncated header");
  EXPECT_NE(error_of([&] { read_npy_header(path("missing.npy")); }).find("No such file"), std::string::npos);
}

// Headers the fuzzer (tests/fuzz/fuzz_npy_header.cpp) and the bit flips of tests/python/test_reliability.py found
// accepted although they do not describe their bytes.
TEST_F(NpyFile, RejectsHeadersThatDoNotDescribeTheirBytes) {
  const auto err = [&](const std::string& dict) {
    const std::string bytes = npy_bytes(dict, 0);
    return error_of([&] { parse_npy_header(bytes.data(), bytes.size(), "f.npy"); });
  };
  // A type string with bytes after its size ('<f4' then NULs) was read as '<f4'.
  EXPECT_NE(err("{'descr': '<f4" + std::string(2, '\0') + "', 'fortran_order': False, 'shape': (3,), }")
                .find("unsupported dtype"),
            std::string::npos);
  EXPECT_NE(err("{'descr': '<f04', 'fortran_order': False, 'shape': (3,), }").find("unsupported dtype"),
            std::string::npos);
  // A size of 0 ended the overflow check: the sizes after it could overflow a row's byte count.
  EXPECT_NE(err("{'descr': '<i4', 'fortran_order': False, 'shape': (0, 9223372036854775807), }").find("overflows"),
            std::string::npos);
  // Text after the dict was ignored (NumPy pads with spaces only).
  EXPECT_NE(err("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } junk").find("after the closing"),
            std::string::npos);
  // A flipped bit made "8" into "08", which Python (and so NumPy) refuses (tests/python/test_reliability.py).
  EXPECT_NE(err("{'descr': '<f4', 'fortran_order': False, 'shape': (64, 08), }").find("leading zero"),
            std::string::npos);
  EXPECT_EQ(err("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }"), "");  // empty arrays stay fine
}

TEST_F(NpyFile, AcceptsWhatNumpyMayWrite) {
  // Version 2.0 and 3.0 headers, a 1-D Fortran-order array (the same bytes as C order), '|' and '=' byte orders,
  // dict keys in another order.
  write_bytes(path("v2.npy"), npy_bytes("{'shape': (3,), 'fortran_order': True, 'descr': '|u1', }", 3, 2));
  EXPECT_EQ(read_npy_header(path("v2.npy")).dtype, at::kByte);
  std::string v3 = npy_bytes("{\"descr\": \"=f8\", \"fortran_order\": False, \"shape\": (1, 2)}", 16, 2);
  v3[6] = 3;
  write_bytes(path("v3.npy"), v3);
  const NpyHeader h = read_npy_header(path("v3.npy"));
  EXPECT_EQ(h.dtype, at::kDouble);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{1, 2}));
}

TEST_F(NpyFile, FailedSaveLeavesTheOldFileIntact) {
  const at::Tensor old_values = at::randn({50, 4});
  save_npy(old_values, path("t.npy"));
  const std::string before = read_bytes(path("t.npy"));
  {
    NpyWriter writer(path("t.npy"), at::kFloat, {50, 4});
    writer.write(at::randn({20, 4}));
    EXPECT_NE(error_of([&] { writer.write(at::randn({40, 4})); }).find("do not fit"), std::string::npos);
    EXPECT_NE(error_of([&] { writer.finish(); }).find("only 20 were written"), std::string::npos);
    EXPECT_EQ(file_count(), 2u);  // the old file and the temporary
  }  // destroyed without commit: the temporary goes, the old file stays
  EXPECT_EQ(read_bytes(path("t.npy")), before);
  EXPECT_EQ(file_count(), 1u);
  EXPECT_NE(error_of([&] { save_npy(at::randn({2, 2}), path("no/such/dir/t.npy")); }).find("must exist"),
            std::string::npos);
  EXPECT_NE(error_of([&] { NpyWriter w(path("x.npy"), at::kFloat, {2, 3}); w.write(at::randn({2, 4})); })
                .find("trailing dimensions must match"),
            std::string::npos);
}

TEST_F(NpyFile, CancelledWriteStopsAtTheNextChunkAndCommitsNothing) {
  const at::Tensor old_values = at::randn({50, 4});
  save_npy(old_values, path("t.npy"));
  const std::string before = read_bytes(path("t.npy"));
  NpyWriter untouched(path("u.npy"), at::kFloat, {50, 4});
  {
    NpyWriter writer(path("t.npy"), at::kFloat, {50, 4}, /*chunk_bytes=*/16 * 4 * 4);  // 16 rows a chunk
    writer.write(at::randn({20, 4}));
    cancel_writes_in_progress();  // what Ctrl-C asks (speedtorch/_interrupt.py)
    EXPECT_NE(error_of([&] { writer.write(at::randn({30, 4})); }).find("was cancelled"), std::string::npos);
    EXPECT_NE(error_of([&] { writer.finish(); }).find("was cancelled"), std::string::npos);
  }
  EXPECT_EQ(read_bytes(path("t.npy")), before);
  // A write that starts after the request runs normally.
  save_npy(at::randn({50, 4}), path("t.npy"));
  EXPECT_NE(read_bytes(path("t.npy")), before);
  // A write begun before the request is cancelled too.
  EXPECT_NE(error_of([&] { untouched.write(at::randn({50, 4})); }).find("was cancelled"), std::string::npos);
}

TEST_F(NpyFile, ReadsOnlyWhatItIsAskedFor) {
  const at::Tensor t = at::randn({10, 2});
  save_npy(t, path("t.npy"));
  NpyReader reader(path("t.npy"));
  at::Tensor part = at::empty({4, 2});
  reader.read(part);
  EXPECT_TRUE(at::equal(part, t.narrow(0, 0, 4)));
  at::Tensor rest = at::empty({7, 2});
  EXPECT_NE(error_of([&] { reader.read(rest); }).find("7 more were asked for"), std::string::npos);
  EXPECT_EQ(reader.rows_read(), 4);
}

}  // namespace
}  // namespace speedtorch::io
