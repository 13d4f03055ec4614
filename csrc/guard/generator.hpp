// generator.hpp: tpu generators (generator.cpp) as boxed.cpp reads them.
#pragma once

#include <ATen/core/Generator.h>

#include "../python/generator_api.h"
#include "../python/guard_api.h"

// Where the default generators' state and the current device come from;
// set before any generator is made.
void tpu_generators_use(const tpu_guard_api* api);

// A new tpu generator of its own (index -1: the current device's), seeded at
// random as torch's generators are.
at::Generator tpu_new_generator(c10::DeviceIndex index);

// tpu:index's default generator (-1: the current device's): the engine's
// generator. Throws c10::Error for an index past the most devices.
const at::Generator& tpu_default_generator(c10::DeviceIndex index);

// The state a random op given g draws from: its own (a generator made by
// torch.Generator(device="tpu")), or NULL for a default tpu generator, the
// engine's own. *tpu: false when g is not a torchtpu generator (another
// device's: the op's Python call then raises). Never throws.
tpu_generator_state* tpu_generator_state_of(const at::Generator& g, bool* tpu) noexcept;
