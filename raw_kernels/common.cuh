// Shared by every kernel file: element types, accumulator types and load/store conversions.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
