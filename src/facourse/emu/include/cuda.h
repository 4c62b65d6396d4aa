// cuda.h for the CPU check (facourse.emu): the types and functions the step uses come from emu_warp.h,
// emu_sm80.h and emu_hopper.h, which the driver includes first.
#pragma once
