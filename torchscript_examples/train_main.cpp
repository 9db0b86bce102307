// speedtorch_trainer: trains a scripted recommender (recommender_model.py) for N steps with no Python in the
// process, calling its TorchScript train_step (forward, loss, torch.autograd.grad, the PinnedEmbedding's fused
// optimizer, the dense parameters' update). Prints one loss per line; optionally saves the trained model.
//
//   speedtorch_trainer MODEL.pt BATCHES.pt STEPS LR [OUT.pt]
#include <torch/script.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL.pt BATCHES.pt STEPS LR [OUT.pt]\n", argv[0]);
    return 2;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    torch::jit::Module batches = torch::jit::load(argv[2]);
    const long steps = std::strtol(argv[3], nullptr, 10);
    const double lr = std::strtod(argv[4], nullptr);
    const int64_t count = batches.attr("users").toTensor().size(0);
    for (long step = 0; step < steps; ++step) {
      const auto batch = batches.forward({static_cast<int64_t>(step % count)}).toList();
      const torch::Tensor loss =
          model.run_method("train_step", batch.get(0).toTensor(), batch.get(1).toTensor(), batch.get(2).toTensor(), lr)
              .toTensor();
      std::printf("%.9g\n", loss.item<double>());
    }
    if (argc > 5) model.save(argv[5]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speedtorch_trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
