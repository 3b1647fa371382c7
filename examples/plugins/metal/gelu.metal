// Example Metal kernel: elementwise gelu (tanh form) over float32.
// Compiled by debug_framework's CompilationEngine with `xcrun metal` + `xcrun metallib` on macOS;
// elsewhere compile_metal_kernel raises DF008 saying why.
#include <metal_stdlib>
using namespace metal;

kernel void gelu_f32(device const float* x [[buffer(0)]],
                     device float* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
  const float v = x[i];
  out[i] = 0.5f * v * (1.0f + precise::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
}
