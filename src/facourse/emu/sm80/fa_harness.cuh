// fa_harness.cuh for the CPU check of step 06 (facourse.emu): the driver runs the four device
// functions of student_kernel.cu alone, on one emulated warp, so the kernel and its launch are not built.
#pragma once
