// Registers speedtorch::IdIndex (csrc/embedding/id_index.h: raw int64 ids -> slots of a fixed-capacity table, with
// admission and eviction) as torch.classes.speedtorch.IdIndex, for Python, TorchScript and C++ alike; it pickles
// (copy.deepcopy, torch.save of a module, torch.jit.save) as its state() tensor.
#include <torch/custom_class.h>
#include <torch/library.h>

#include "embedding/id_index.h"

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  using speedtorch::IdIndex;
  m.class_<IdIndex>("IdIndex")
      .def(torch::init<int64_t, int64_t, std::string, int64_t>(),
           "An index of raw int64 ids onto `capacity` slots: ids get a slot after admit_after sightings; when the "
           "slots are used up, the lowest-scored row (policy 'lru' or 'lfu') not seen in the current step is evicted "
           "(capacity and candidate_capacity up to 2^32 - 1)",
           {torch::arg("capacity"), torch::arg("admit_after") = 1, torch::arg("policy") = "lru",
            torch::arg("candidate_capacity") = 0})
      .def("assign", &IdIndex::assign,
           "(slots, admitted, evicted_keys, evicted_slots): slots of ids (-1: not admitted), admitting and evicting "
           "(CUDA ids go through the host)",
           {torch::arg("ids")})
      .def("touch", &IdIndex::touch,
           "assign's first half: slots of the ids in the table, which are counted as seen; -1 for the others, which "
           "admit() handles",
           {torch::arg("ids")})
      .def("admit", &IdIndex::admit,
           "assign's second half, for (ids, touch(ids)) with nothing else in between: (slots, admitted, "
           "evicted_keys, evicted_slots); rows seen since step protect_from (default: the current one) are not "
           "evicted",
           {torch::arg("ids"), torch::arg("slots"), torch::arg("protect_from") = c10::IValue()})
      .def("find", &IdIndex::find, "Slots of ids (-1: not in the table), changing nothing", {torch::arg("ids")})
      .def("step", &IdIndex::step)
      .def("advance_step", &IdIndex::advance_step, "Moves to the next step (rows seen in the current one stay)")
      .def("capacity", &IdIndex::capacity)
      .def("admit_after", &IdIndex::admit_after)
      .def("policy", &IdIndex::policy)
      .def("candidate_capacity", &IdIndex::candidate_capacity)
      .def("size", &IdIndex::size, "Slots in use")
      .def("candidates", &IdIndex::candidates, "Ids in the candidate pool")
      .def("keys", &IdIndex::keys, "The key of each used slot (slot order), a copy")
      .def("counts", &IdIndex::counts, "The sighting count of each used slot, a copy")
      .def("last_steps", &IdIndex::last_steps, "The step each used slot was last seen, a copy")
      .def("reserve", &IdIndex::reserve, "Makes room for this many keys (at most capacity) now",
           {torch::arg("keys")})
      .def("memory_bytes", &IdIndex::memory_bytes, "Bytes the index holds in host RAM")
      .def("state", &IdIndex::state, "Everything the index holds, as one int64 tensor (csrc/embedding/id_index.h)")
      .def("load_state", &IdIndex::load_state, "Replaces the contents with a state() of a matching index",
           {torch::arg("state")})
      .def_static("from_state", &IdIndex::from_state, "A new index from a state()")
      .def("__repr__", &IdIndex::repr)
      .def("__str__", &IdIndex::repr)
      .def_pickle([](const c10::intrusive_ptr<IdIndex>& self) { return self->state(); },
                  [](at::Tensor state) { return IdIndex::from_state(state); });
}
