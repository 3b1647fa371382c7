// Example CUDA kernel: rms_norm, one block per row (a custom op, like the C++ example's).
// Built with nvcc by debug_framework's CompilationEngine where a CUDA GPU and nvcc are present;
// elsewhere plugin_compile reports why it cannot build (DF008) and the example's test skips.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

template <typename scalar_t>
__global__ void rms_norm_rows(const scalar_t* x, const scalar_t* w, scalar_t* out, int64_t d, double eps) {
  __shared__ double partial[256];
  const int64_t row = blockIdx.x;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const double v = static_cast<double>(x[row * d + j]);
    sum += v * v;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const double inv = rsqrt(partial[0] / static_cast<double>(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    out[row * d + j] = static_cast<scalar_t>(static_cast<double>(x[row * d + j]) * inv * static_cast<double>(w[j]));
  }
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  TORCH_CHECK(x_in.is_cuda() && w_in.is_cuda(), "rms_norm: expected CUDA tensors");
  const int64_t d = x_in.size(-1);
  TORCH_CHECK(w_in.dim() == 1 && w_in.size(0) == d, "rms_norm: w must have shape [", d, "]");
  at::Tensor x = x_in.contiguous();
  at::Tensor w = w_in.to(x.scalar_type()).contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  if (rows == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "df_cuda_rms_norm", [&] {
    rms_norm_rows<scalar_t><<<rows, 256>>>(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                                           out.mutable_data_ptr<scalar_t>(), d, eps);
  });
  return out;
}

at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor&, double) { return at::empty_like(x); }

}  // namespace

TORCH_LIBRARY(df_cuda_example, m) { m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor"); }
TORCH_LIBRARY_IMPL(df_cuda_example, CUDA, m) { m.impl("rms_norm", &rms_norm); }
TORCH_LIBRARY_IMPL(df_cuda_example, Meta, m) { m.impl("rms_norm", &rms_norm_meta); }
