// Example C++ kernels for CPU: gelu (implements aten::gelu) and rms_norm (a custom op).
// Built by debug_framework's CompilationEngine against the running torch; the operators are
// registered with TORCH_LIBRARY, with Meta kernels so tracing and torch.library.opcheck work.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <string_view>

namespace {

at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  TORCH_CHECK(self.is_floating_point(), "gelu: expected a floating-point tensor, got ", self.scalar_type());
  const bool tanh_approx = std::string_view(approximate.data(), approximate.size()) == "tanh";
  TORCH_CHECK(tanh_approx || std::string_view(approximate.data(), approximate.size()) == "none",
              "gelu: approximate must be 'none' or 'tanh'");
  at::Tensor x = self.contiguous();
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "df_example_gelu", [&] {
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = static_cast<double>(in[i]);
      const double y = tanh_approx
          ? 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)))
          : 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
      o[i] = static_cast<scalar_t>(y);
    }
  });
  return out;
}

// y = x / sqrt(mean(x^2 over the last dim) + eps) * w
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  TORCH_CHECK(x_in.dim() >= 1, "rms_norm: x needs at least one dim");
  const int64_t d = x_in.size(-1);
  TORCH_CHECK(w_in.dim() == 1 && w_in.size(0) == d, "rms_norm: w must have shape [", d, "]");
  at::Tensor x = x_in.contiguous();
  at::Tensor w = w_in.to(x.scalar_type()).contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "df_example_rms_norm", [&] {
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    const scalar_t* wt = w.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        const double v = static_cast<double>(in[r * d + j]);
        sum += v * v;
      }
      const double inv = 1.0 / std::sqrt(sum / static_cast<double>(d) + eps);
      for (int64_t j = 0; j < d; ++j) {
        o[r * d + j] = static_cast<scalar_t>(static_cast<double>(in[r * d + j]) * inv * static_cast<double>(wt[j]));
      }
    }
  });
  return out;
}

at::Tensor gelu_meta(const at::Tensor& self, c10::string_view) { return at::empty_like(self); }
at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor&, double) { return at::empty_like(x); }

}  // namespace

TORCH_LIBRARY(df_example, m) {
  m.def("gelu(Tensor self, *, str approximate='none') -> Tensor");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(df_example, CPU, m) {
  m.impl("gelu", &gelu);
  m.impl("rms_norm", &rms_norm);
}

TORCH_LIBRARY_IMPL(df_example, Meta, m) {
  m.impl("gelu", &gelu_meta);
  m.impl("rms_norm", &rms_norm_meta);
}
