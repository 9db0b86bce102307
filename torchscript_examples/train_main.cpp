// speedtorch_trainer: trains a scripted recommender (recommender_model.py) for N steps with no Python in the
// process, calling its TorchScript train_step (forward, loss, torch.autograd.grad, the PinnedEmbedding's fused
// optimizer, the dense parameters' update). Prints one loss per line; optionally saves the trained model.
//
//   speedtorch_trainer MODEL.pt BATCHES.pt STEPS LR [OUT.pt]
#include <torch/script.h>

#include <cstdio>
#include <exception>
#include <string>

#include "command_line_numbers.h"

int main(int argc, char** argv) {
  const bool help = argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h");
  if (argc < 5) {
    std::fprintf(help ? stdout : stderr, "usage: %s MODEL.pt BATCHES.pt STEPS LR [OUT.pt]\n", argv[0]);
    return help ? 0 : 2;
  }
  // Read whole before anything loads ("4x" used to run 4 steps, "abc" none).
  const auto steps = speedtorch::examples::whole_integer(argv[3], 0, 1ll << 40);
  const auto lr = speedtorch::examples::whole_number(argv[4], 0, 1e6);
  if (!steps || !lr) {
    std::fprintf(stderr, "speedtorch_trainer: %s takes %s, got '%s'\n", steps ? "LR" : "STEPS",
                 steps ? "a finite number in [0, 1e6]" : "an integer in [0, 2^40]", steps ? argv[4] : argv[3]);
    return 2;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    torch::jit::Module batches = torch::jit::load(argv[2]);
    const int64_t count = batches.attr("users").toTensor().size(0);
    for (long long step = 0; step < *steps; ++step) {
      const auto batch = batches.forward({static_cast<int64_t>(step % count)}).toList();
      const torch::Tensor loss =
          model.run_method("train_step", batch.get(0).toTensor(), batch.get(1).toTensor(), batch.get(2).toTensor(), *lr)
              .toTensor();
      std::printf("%.9g\n", loss.item<double>());
    }
    if (argc > 5) model.save(argv[5]);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "speedtorch_trainer: %s\n", e.what_without_backtrace());  // no backtrace of torch's own
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speedtorch_trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
