"""The operators an artifact's program may call: the model's math, nothing else.

A program's graph names each node's target as a string (``torch.ops.aten.add.Tensor``), which
torch resolves and calls. The graph check (`replay.runtime.pt2.graph_check`) accepts a target
only when `op_kind` knows it:

- ``aten`` overloads of the tables below, generated from torch's own operator metadata by
  ``tools/allowed_ops.py`` (its docstring says how: the core ATen set, the ``pointwise`` tag, the
  composites torch.export keeps, the few others real transformers exports emit, minus anything
  that writes an argument, touches a file, prints or reads the environment);
- in-place overloads (``masked_fill_``, ``index_copy_``, ``copy_``): they may write only a
  buffer of the program, an input, or a tensor the program made; never a parameter or a
  constant (the graph check follows views back to the tensor they alias, `VIEW_OPS`);
- the higher-order operators and Python callables torch.export writes around the math (size
  arithmetic from ``operator`` and ``math``, ``torch.sym_*``, grad-mode switches);
- another namespace (a custom operator library the serving process loads itself) only when
  the caller names it: ``replay.load(path, allow_ops=["mylib"])`` or ``capture check
  --allow-ops mylib`` (a namespace, or one ``namespace.op``).

``aten.from_file`` (maps a file), ``aten._print`` and every unlisted operator are refused by
name. Needs no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from replay.runtime.guards import ArtifactError

__all__ = [
    "ALLOWED_OPS",
    "INPLACE_OPS",
    "VIEW_OPS",
    "HIGHER_ORDER_OPS",
    "TORCH_CALLABLES",
    "OPERATOR_FUNCTIONS",
    "AllowOps",
    "allow_ops",
    "op_kind",
    "check_op",
]

AllowOps = frozenset[str]
"""Caller-named namespaces (``mylib``) and operators (``mylib.op``) beyond the tables."""

TORCH_CALLABLES = frozenset(
    """sym_float sym_int sym_max sym_min sym_not sym_ite sym_sqrt sym_sum _sym_sqrt _check
    _check_is_size _assert _assert_async _assert_scalar _constrain_as_size _constrain_as_value
    amp.autocast_mode._enter_autocast amp.autocast_mode._exit_autocast _C._set_grad_enabled
    autograd.grad_mode.set_grad_enabled""".split()
)
"""``torch.<name>`` callables torch.export writes: symbolic size arithmetic, its assertions,
grad and autocast switches."""

OPERATOR_FUNCTIONS = frozenset(
    """add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge and_ or_ xor not_
    invert getitem lshift rshift matmul truth index""".split()
)
"""``_operator.<name>`` functions (size arithmetic on symbolic ints, ``getitem`` of a
multi-output node)."""

HIGHER_ORDER_OPS = frozenset(
    {"wrap_with_set_grad_enabled", "wrap_with_autocast", "cond", "while_loop"}
)
"""``torch.ops.higher_order.<name>``: they run the program's own subgraphs (checked as the
top graph is)."""

_MATH = re.compile(r"[a-z][a-z0-9]*\Z")


def allow_ops(names: Iterable[str] | None) -> AllowOps:
    """The caller's extra namespaces/operators, normalised (``mylib::op`` -> ``mylib.op``).

    Raises:
        ArtifactError: A name that is not ``namespace`` or ``namespace.op``.

    Example:
        >>> sorted(allow_ops(["mylib", "other::fused"]))
        ['mylib', 'other.fused']
    """
    out = set()
    for name in names or ():
        text = str(name).replace("::", ".")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", text):
            raise ArtifactError(
                f"allow_ops: {str(name)[:80]!r} is not an operator namespace (mylib) or one "
                "operator (mylib.op)"
            )
        out.add(text)
    return frozenset(out)


def op_kind(target: str, allowed: AllowOps = frozenset()) -> str | None:
    """What a node target is: ``pure``, ``view``, ``inplace`` (writes its ``self``), or None
    when the program may not call it.

    Example:
        >>> op_kind("torch.ops.aten.linear.default"), op_kind("torch.ops.aten.from_file.default")
        ('pure', None)
        >>> op_kind("torch.ops.mylib.fused.default", allow_ops(["mylib"]))
        'pure'
    """
    if target.startswith("#"):  # torch's spelling of an operator of a loaded library
        namespace, _, op = target[1:].partition(":")
        return "pure" if namespace in allowed or f"{namespace}.{op}" in allowed else None
    module, _, rest = target.partition(".")
    if module == "_operator":
        return "pure" if rest in OPERATOR_FUNCTIONS else None
    if module == "math":
        return "pure" if _MATH.match(rest) else None
    if module != "torch":
        return None
    if not rest.startswith("ops."):
        return "pure" if rest in TORCH_CALLABLES else None
    parts = rest.split(".")[1:]
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts) or len(parts) > 3:
        return None
    if parts[0] == "higher_order":
        return "pure" if len(parts) == 2 and parts[1] in HIGHER_ORDER_OPS else None
    if len(parts) != 3:
        return None
    namespace, op, overload = parts
    if namespace == "aten":
        name = f"{op}.{overload}"
        if name in INPLACE_OPS:
            return "inplace"
        if name in VIEW_OPS:
            return "view"
        return "pure" if name in ALLOWED_OPS else None
    if op.startswith("__") or overload.startswith("__"):
        return None
    return "pure" if namespace in allowed or f"{namespace}.{op}" in allowed else None


def check_op(target: str, allowed: AllowOps = frozenset()) -> bool:
    """True when a program may call `target` (`op_kind` knows it).

    Example:
        >>> check_op("torch.ops.aten._print.default")
        False
    """
    return op_kind(target, allowed) is not None


# --- generated by tools/allowed_ops.py ---
# torch 2.13.0+cpu: 969 pure, 200 in-place, 26 view overloads of aten
_PURE = """
__and__.Scalar __and__.Tensor __lshift__.Scalar __lshift__.Tensor __or__.Scalar __or__.Tensor
__rshift__.Scalar __rshift__.Tensor __xor__.Scalar __xor__.Tensor _adaptive_avg_pool2d.default
_adaptive_avg_pool2d_backward.default _adaptive_avg_pool3d.default _add_batch_dim.default
_assert_async.default _assert_async.msg _assert_scalar.default _assert_tensor_metadata.default
_backward.default _batch_norm_impl_index_backward.default _cast_Byte.default _cast_Char.default
_cast_Double.default _cast_Float.default _cast_Half.default _cast_Int.default _cast_Long.default
_cast_Short.default _cdist_forward.default _choose_qparams_per_tensor.default _chunk_cat.default
_conj_physical.default _convolution.deprecated _convolution_double_backward.default
_convolution_mode.default _cufft_clear_plan_cache.default _cufft_get_plan_cache_max_size.default
_cufft_get_plan_cache_size.default _cufft_set_plan_cache_max_size.default
_debug_has_internal_overlap.default _dim_arange.default _embedding_bag.default
_embedding_bag_sparse_backward.default _euclidean_dist.default _fft_c2r.default _fft_r2c.default
_functional_assert_async.msg _functional_assert_scalar.default
_functional_sym_constrain_range.default _functional_sym_constrain_range_for_size.default
_fused_rms_norm.default _fused_rms_norm_backward.default _gather_sparse_backward.default
_has_compatible_shallow_copy_type.default _is_zerotensor.default _local_scalar_dense.default
_log_softmax.default _log_softmax_backward_data.default _lu_with_info.default
_native_batch_norm_legit.no_stats _native_batch_norm_legit_no_training.default
_nnpack_available.default _pack_padded_sequence_backward.default _pad_circular.default
_pad_enum.default _pad_packed_sequence.default _pdist_forward.default _prelu_kernel.default
_prelu_kernel_backward.default _propagate_xla_data.default _remove_batch_dim.default
_reshape_alias.default _reshape_from_tensor.default _rowwise_prune.default _safe_softmax.default
_saturate_weight_to_fp16.default _scaled_dot_product_attention_math.default
_scaled_dot_product_cudnn_attention.default _scaled_dot_product_efficient_attention.default
_scaled_dot_product_flash_attention.default _scaled_dot_product_flash_attention_for_cpu.default
_shape_as_tensor.default _sobol_engine_draw.default _softmax.default
_softmax_backward_data.default _sparse_bsc_tensor_unsafe.default
_sparse_bsr_tensor_unsafe.default _sparse_compressed_tensor_unsafe.default
_sparse_coo_tensor_unsafe.default _sparse_csc_tensor_unsafe.default
_sparse_csr_tensor_unsafe.default _sparse_log_softmax.int _sparse_mm.default _sparse_mm.reduce
_sparse_softmax.int _sparse_sum.default _sparse_sum.dim_dtype _sparse_sum.dtype
_test_ambiguous_defaults.a _test_ambiguous_defaults.b _test_autograd_multiple_dispatch.ntonly
_test_check_tensor.default _test_serialization_subcmul.default _test_string_default.default
_thnn_differentiable_gru_cell_backward.default _thnn_differentiable_lstm_cell_backward.default
_thnn_fused_lstm_cell_backward.default _to_copy.default _to_cpu.default _unsafe_index.Tensor
_unsafe_index_put.default _unsafe_masked_index.default
_unsafe_masked_index_put_accumulate.default _unsafe_view.default _upsample_bicubic2d_aa.vec
_upsample_bilinear2d_aa.vec _upsample_lanczos2d_aa.vec _upsample_nearest_exact1d.default
_upsample_nearest_exact1d.vec _upsample_nearest_exact2d.default _upsample_nearest_exact2d.vec
_upsample_nearest_exact3d.default _upsample_nearest_exact3d.vec
_use_cudnn_rnn_flatten_weight.default _validate_sparse_bsc_tensor_args.default
_validate_sparse_bsr_tensor_args.default _validate_sparse_compressed_tensor_args.default
_validate_sparse_coo_tensor_args.default _validate_sparse_csc_tensor_args.default
_validate_sparse_csr_tensor_args.default _version.default _weight_norm.default
_weight_norm_differentiable_backward.default _weight_norm_interface.default
_wrapped_linear_prepack.default _wrapped_quantized_linear_prepacked.default abs.default
absolute.default acos.default acosh.default adaptive_avg_pool1d.default
adaptive_avg_pool2d.default adaptive_avg_pool3d.default adaptive_max_pool1d.default add.Scalar
add.Tensor addcdiv.default addcmul.default addmm.default addr.default
affine_grid_generator.default affine_grid_generator_backward.default alias.default
alias_copy.default all.default all.dim all.dims amax.default amin.default aminmax.default
angle.default any.default any.dim any.dims arange.default arange.start arange.start_step
arccos.default arccosh.default arcsin.default arcsinh.default arctan.default arctan2.default
arctanh.default argmax.default argmin.default argsort.default argsort.stable argwhere.default
as_strided.default asin.default asinh.default atan.default atan2.default atanh.default
atleast_1d.Sequence atleast_2d.Sequence atleast_3d.Sequence avg_pool1d.default
avg_pool2d.default avg_pool2d_backward.default avg_pool3d.default baddbmm.default baddbmm.dtype
bernoulli.default bilinear.default binary_cross_entropy.default
binary_cross_entropy_backward.default binary_cross_entropy_with_logits.default
bitwise_and.Scalar bitwise_and.Scalar_Tensor bitwise_and.Tensor bitwise_left_shift.Scalar_Tensor
bitwise_left_shift.Tensor bitwise_left_shift.Tensor_Scalar bitwise_not.default bitwise_or.Scalar
bitwise_or.Scalar_Tensor bitwise_or.Tensor bitwise_right_shift.Scalar_Tensor
bitwise_right_shift.Tensor bitwise_right_shift.Tensor_Scalar bitwise_xor.Scalar
bitwise_xor.Scalar_Tensor bitwise_xor.Tensor block_diag.default bmm.default
broadcast_tensors.default can_cast.default cat.default cdist.default ceil.default celu.default
chain_matmul.default chalf.default channel_shuffle.default choose_qparams_optimized.default
clamp.Tensor clamp.default clamp_max.Tensor clamp_max.default clamp_min.Tensor clamp_min.default
clip.Tensor clip.default clone.default col2im.default column_stack.default combinations.default
concat.default concatenate.default conj_physical.default constant_pad_nd.default
contiguous.default conv1d.default conv1d.padding conv2d.default conv2d.padding conv3d.default
conv3d.padding conv_tbc_backward.default conv_transpose1d.default conv_transpose2d.input
conv_transpose3d.input convolution.default convolution_backward.default copy.default
copysign.Scalar copysign.Tensor corrcoef.default cos.default cosh.default
cosine_embedding_loss.default cosine_similarity.default count_nonzero.default
count_nonzero.dim_IntList cov.default cross.default cross_entropy_loss.default ctc_loss.IntList
ctc_loss.Tensor cudnn_batch_norm.default cudnn_batch_norm_backward.default
cudnn_is_acceptable.default cummaxmin_backward.default cumprod_backward.default cumsum.default
cumulative_trapezoid.dx cumulative_trapezoid.x data.default deg2rad.default det.default
detach.default diag.default diag_embed.default diagflat.default diagonal.default
diagonal_backward.default diagonal_copy.default diff.default digamma.default div.Scalar
div.Scalar_mode div.Tensor div.Tensor_mode divide.Scalar divide.Scalar_mode divide.Tensor
divide.Tensor_mode dot.default dropout.default dstack.default einsum.default elu.default
elu_backward.default embedding.default embedding_backward.default embedding_bag.default
embedding_bag.padding_idx embedding_dense_backward.default embedding_sparse_backward.default
empty.memory_format empty_like.default empty_strided.default eq.Scalar eq.Tensor equal.default
erf.default erfc.default erfinv.default exp.default exp2.default expand.default
expand_copy.default expm1.default eye.default eye.m fake_quantize_per_channel_affine.default
fake_quantize_per_channel_affine_cachemask_backward.default
fake_quantize_per_tensor_affine.default fake_quantize_per_tensor_affine.tensor_qparams
fake_quantize_per_tensor_affine_cachemask_backward.default fbgemm_linear_fp16_weight.default
fbgemm_linear_fp16_weight_fp32_activation.default fbgemm_linear_int8_weight.default
fbgemm_linear_int8_weight_fp32_activation.default fbgemm_linear_quantize_weight.default
fbgemm_pack_gemm_matrix_fp16.default fbgemm_pack_quantized_matrix.KN
fbgemm_pack_quantized_matrix.default fft_fft.default fft_fft2.default fft_fftn.default
fft_fftshift.default fft_hfft.default fft_hfft2.default fft_hfftn.default fft_ifft.default
fft_ifft2.default fft_ifftn.default fft_ifftshift.default fft_ihfft.default fft_ihfft2.default
fft_ihfftn.default fft_irfft.default fft_irfft2.default fft_irfftn.default fft_rfft.default
fft_rfft2.default fft_rfftn.default fill.Scalar fill.Tensor fix.default
flatten_dense_tensors.default flip.default fliplr.default flipud.default float_power.Scalar
float_power.Tensor_Scalar float_power.Tensor_Tensor floor.default floor_divide.Scalar
floor_divide.default fmax.default fmin.default fmod.Scalar fmod.Tensor frac.default frexp.Tensor
frobenius_norm.dim full.default full_like.default gather.default gather_backward.default
gcd.default ge.Scalar ge.Tensor gelu.default gelu_backward.default ger.default
get_device.default get_gradients.default glu.default glu_backward.default gradient.array
gradient.scalararray gradient.scalarint gradient.scalarrayarray gradient.scalarrayint
gradient.tensorarray gradient.tensorarrayint greater.Scalar greater.Tensor greater_equal.Scalar
greater_equal.Tensor grid_sampler.default grid_sampler_2d.default group_norm.default gru.data
gru.input gru_cell.default gt.Scalar gt.Tensor hann_window.default hann_window.periodic
hardshrink.default hardsigmoid.default hardsigmoid_backward.default hardswish.default
hardswish_backward.default hardtanh.default hardtanh_backward.default heaviside.default
hinge_embedding_loss.default histogramdd.TensorList_bins histogramdd.default
histogramdd.int_bins hstack.default huber_loss.default huber_loss_backward.default hypot.default
i0.default igamma.default igammac.default im2col.default index.Tensor index_add.default
index_copy.default index_fill.int_Scalar index_fill.int_Tensor index_put.default
index_select.default index_select_backward.default
infinitely_differentiable_gelu_backward.default inner.default instance_norm.default
inverse.default is_complex.default is_conj.default is_distributed.default
is_floating_point.default is_inference.default is_leaf.default is_neg.default is_nonzero.default
is_signed.default is_vulkan_available.default isclose.default isfinite.default
isin.Scalar_Tensor isin.Tensor_Scalar isin.Tensor_Tensor isinf.default isnan.default
isneginf.default isposinf.default isreal.default istft.default item.default kl_div.default
kron.default l1_loss.default layer_norm.default lcm.default ldexp.Tensor le.Scalar le.Tensor
leaky_relu.default leaky_relu_backward.default lerp.Scalar lerp.Tensor less.Scalar less.Tensor
less_equal.Scalar less_equal.Tensor lgamma.default lift_fresh_copy.default
linalg_cholesky.default linalg_cond.default linalg_cond.p_str linalg_cross.default
linalg_det.default linalg_eigh.default linalg_eigvals.default linalg_eigvalsh.default
linalg_inv.default linalg_ldl_factor.default linalg_lu_factor.default linalg_matmul.default
linalg_matrix_norm.default linalg_matrix_norm.str_ord linalg_matrix_power.default
linalg_matrix_rank.atol_rtol_float linalg_matrix_rank.atol_rtol_tensor
linalg_matrix_rank.default linalg_matrix_rank.tol_tensor linalg_multi_dot.default
linalg_norm.default linalg_norm.ord_str linalg_pinv.atol_rtol_float linalg_pinv.default
linalg_pinv.rcond_tensor linalg_slogdet.default linalg_solve.default linalg_solve_ex.default
linalg_svd.default linalg_svdvals.default linalg_tensorinv.default linalg_tensorsolve.default
linalg_vander.default linalg_vecdot.default linear.default linspace.Scalar_Tensor
linspace.Tensor_Scalar linspace.Tensor_Tensor linspace.default log.default log10.default
log1p.default log2.default log_sigmoid.default log_sigmoid_backward.default
log_sigmoid_forward.default log_softmax.int logaddexp.default logaddexp2.default logdet.default
logical_and.default logical_not.default logical_or.default logical_xor.default logit.default
logit_backward.default logspace.Scalar_Tensor logspace.Tensor_Scalar logspace.Tensor_Tensor
logspace.default logsumexp.default lstm.data lstm.input lstm_cell.default lt.Scalar lt.Tensor
lu_solve.default margin_ranking_loss.default masked_fill.Scalar masked_fill.Tensor
masked_scatter.default masked_select_backward.default matmul.default matrix_exp.default
matrix_exp_backward.default matrix_power.default max.dim max.other max_pool1d.default
max_pool1d_with_indices.default max_pool2d.default max_pool2d_with_indices.default
max_pool2d_with_indices_backward.default max_pool3d.default max_pool3d_with_indices.default
max_unpool2d.default max_unpool3d.default maximum.default mean.default mean.dim meshgrid.default
meshgrid.indexing min.dim min.other minimum.default miopen_batch_norm_backward.default
mish.default mish_backward.default mm.default mse_loss.default mse_loss_backward.default
msort.default mul.Scalar mul.Tensor multi_margin_loss.default multilabel_margin_loss.default
multilabel_margin_loss_forward.default multiply.Scalar multiply.Tensor mv.default
mvlgamma.default nan_to_num.default nanmean.default nanquantile.default nanquantile.scalar
nansum.default native_batch_norm_backward.default native_channel_shuffle.default
native_dropout.default native_dropout_backward.default native_group_norm.default
native_group_norm_backward.default native_layer_norm.default native_layer_norm_backward.default
ne.Scalar ne.Tensor neg.default negative.default nested_to_padded_tensor.default
new_empty.default new_full.default new_ones.default new_zeros.default nextafter.default
nll_loss.default nll_loss2d.default nll_loss2d_backward.default nll_loss2d_forward.default
nll_loss_backward.default nll_loss_forward.default nll_loss_nd.default nonzero.default
nonzero_numpy.default norm.Scalar norm.ScalarOpt_dim norm.ScalarOpt_dim_dtype
norm.ScalarOpt_dtype norm_except_dim.default not_equal.Scalar not_equal.Tensor
nuclear_norm.default nuclear_norm.dim one_hot.default ones.default ones_like.default
orgqr.default outer.default output_nr.default pad.default pad_sequence.default
pairwise_distance.default pdist.default permute.default pinverse.default pixel_shuffle.default
pixel_unshuffle.default poisson_nll_loss.default polygamma.default positive.default pow.Scalar
pow.Tensor_Scalar pow.Tensor_Tensor prelu.default prod.default prod.dim_int
promote_types.default qr.default quantile.default quantile.scalar quantized_gru_cell.default
quantized_lstm_cell.default quantized_rnn_relu_cell.default quantized_rnn_tanh_cell.default
rad2deg.default rand.default randn.default randperm.default reciprocal.default
reflection_pad1d.default reflection_pad1d_backward.default reflection_pad2d.default
reflection_pad2d_backward.default reflection_pad3d.default reflection_pad3d_backward.default
relu.default relu6.default remainder.Scalar remainder.Scalar_Tensor remainder.Tensor
renorm.default repeat.default repeat_interleave.self_Tensor repeat_interleave.self_int
replication_pad1d.default replication_pad2d.default replication_pad3d.default resize_as.default
result_type.Scalar result_type.Scalar_Scalar result_type.Scalar_Tensor result_type.Tensor
retains_grad.default rms_norm.default rnn_relu.data rnn_relu.input rnn_relu_cell.default
rnn_tanh.data rnn_tanh.input rnn_tanh_cell.default roll.default rot90.default round.decimals
round.default row_stack.default rrelu.default rsqrt.default rsub.Scalar rsub.Tensor
scalar_tensor.default scaled_dot_product_attention.default scatter.src scatter.value
scatter_add.default scatter_reduce.two select.int select_backward.default select_scatter.default
selu.default sgn.default sigmoid.default sigmoid_backward.default sign.default signbit.default
silu.default silu_backward.default sin.default sinc.default sinh.default size.int slice.Tensor
slice_backward.default slice_scatter.default slogdet.default slow_conv3d.default smm.default
smooth_l1_loss.default smooth_l1_loss_backward.default soft_margin_loss.default
soft_margin_loss_backward.default softmax.int softplus.default softplus_backward.default
softshrink.default sort.default sparse_bsc_tensor.ccol_row_value
sparse_bsc_tensor.ccol_row_value_size sparse_bsr_tensor.crow_col_value
sparse_bsr_tensor.crow_col_value_size sparse_coo_tensor.indices sparse_coo_tensor.indices_size
sparse_csc_tensor.ccol_row_value sparse_csc_tensor.ccol_row_value_size
sparse_csr_tensor.crow_col_value sparse_csr_tensor.crow_col_value_size special_airy_ai.default
special_bessel_j0.default special_bessel_j1.default special_bessel_y0.default
special_bessel_y1.default special_chebyshev_polynomial_t.default
special_chebyshev_polynomial_t.n_scalar special_chebyshev_polynomial_t.x_scalar
special_chebyshev_polynomial_u.default special_chebyshev_polynomial_u.n_scalar
special_chebyshev_polynomial_u.x_scalar special_chebyshev_polynomial_v.default
special_chebyshev_polynomial_v.n_scalar special_chebyshev_polynomial_v.x_scalar
special_chebyshev_polynomial_w.default special_chebyshev_polynomial_w.n_scalar
special_chebyshev_polynomial_w.x_scalar special_digamma.default special_entr.default
special_erf.default special_erfc.default special_erfcx.default special_erfinv.default
special_exp2.default special_expit.default special_expm1.default special_gammainc.default
special_gammaincc.default special_gammaln.default special_hermite_polynomial_h.default
special_hermite_polynomial_h.n_scalar special_hermite_polynomial_h.x_scalar
special_hermite_polynomial_he.default special_hermite_polynomial_he.n_scalar
special_hermite_polynomial_he.x_scalar special_i0.default special_i0e.default special_i1.default
special_i1e.default special_laguerre_polynomial_l.default special_laguerre_polynomial_l.n_scalar
special_laguerre_polynomial_l.x_scalar special_legendre_polynomial_p.default
special_legendre_polynomial_p.n_scalar special_legendre_polynomial_p.x_scalar
special_log1p.default special_log_ndtr.default special_log_softmax.default special_logit.default
special_logsumexp.default special_modified_bessel_i0.default special_modified_bessel_i1.default
special_modified_bessel_k0.default special_modified_bessel_k1.default
special_multigammaln.default special_ndtr.default special_ndtri.default
special_polygamma.default special_psi.default special_round.default
special_scaled_modified_bessel_k0.default special_scaled_modified_bessel_k1.default
special_shifted_chebyshev_polynomial_t.default special_shifted_chebyshev_polynomial_t.n_scalar
special_shifted_chebyshev_polynomial_t.x_scalar special_shifted_chebyshev_polynomial_u.default
special_shifted_chebyshev_polynomial_u.n_scalar special_shifted_chebyshev_polynomial_u.x_scalar
special_shifted_chebyshev_polynomial_v.default special_shifted_chebyshev_polynomial_v.n_scalar
special_shifted_chebyshev_polynomial_v.x_scalar special_shifted_chebyshev_polynomial_w.default
special_shifted_chebyshev_polynomial_w.n_scalar special_shifted_chebyshev_polynomial_w.x_scalar
special_sinc.default special_softmax.default special_spherical_bessel_j0.default
special_xlog1py.default special_xlog1py.other_scalar special_xlog1py.self_scalar
special_xlogy.default special_xlogy.other_scalar special_xlogy.self_scalar special_zeta.default
special_zeta.other_scalar special_zeta.self_scalar split.Tensor split_with_sizes.default
split_with_sizes_copy.default sqrt.default square.default squeeze.default squeeze.dim
squeeze.dims squeeze_copy.default squeeze_copy.dim squeeze_copy.dims sspaddmm.default
stack.default std.correction std.default std.dim std_mean.correction std_mean.default
std_mean.dim stft.center stft.default stride.int sub.Scalar sub.Tensor subtract.Scalar
subtract.Tensor sum.default sum.dim_IntList sum_to_size.default svd.default
sym_constrain_range.default sym_constrain_range_for_size.default sym_is_contiguous.default
sym_numel.default sym_size.int sym_storage_offset.default sym_stride.int t.default
t_copy.default take.default take_along_dim.default tan.default tanh.default
tanh_backward.default tensordot.default thnn_conv2d.default threshold.default
threshold_backward.default tile.default to.device to.dtype to.dtype_layout to.other
to.prim_Device to.prim_dtype to.prim_other to_dense.default to_dense_backward.default
to_mkldnn_backward.default to_sparse.default to_sparse.sparse_dim to_sparse_bsc.default
to_sparse_bsr.default to_sparse_csc.default to_sparse_csr.default topk.default trace.default
trace_backward.default transpose.int transpose_copy.int trapezoid.dx trapezoid.x trapz.dx
trapz.x tril.default triplet_margin_loss.default triu.default true_divide.Scalar
true_divide.Tensor trunc.default type_as.default unbind.int unflatten.int
unflatten_dense_tensors.default unfold_backward.default unfold_copy.default unsafe_split.Tensor
unsafe_split_with_sizes.default unsqueeze.default unsqueeze_copy.default upsample_bicubic2d.vec
upsample_bilinear2d.vec upsample_linear1d.default upsample_linear1d.vec
upsample_nearest1d.default upsample_nearest1d.vec upsample_nearest2d.default
upsample_nearest2d.vec upsample_nearest3d.default upsample_nearest3d.vec
upsample_trilinear3d.vec value_selecting_reduction_backward.default vander.default
var.correction var.default var.dim var_mean.default var_mean.dim vdot.default view.default
vstack.default where.Scalar where.ScalarOther where.ScalarSelf where.default where.self
xlogy.Scalar_Other xlogy.Scalar_Self xlogy.Tensor zero.default zeros.default zeros_like.default
"""

_INPLACE = """
__ilshift__.Scalar __ilshift__.Tensor __ixor__.Scalar __ixor__.Tensor abs_.default
absolute_.default acos_.default acosh_.default add_.Scalar add_.Tensor addcdiv_.default
addcmul_.default addmm_.default addr_.default arccos_.default arccosh_.default arcsin_.default
arcsinh_.default arctan2_.default arctan_.default arctanh_.default as_strided_.default
asin_.default asinh_.default atan2_.default atan_.default atanh_.default baddbmm_.default
bitwise_and_.Scalar bitwise_and_.Tensor bitwise_left_shift_.Tensor
bitwise_left_shift_.Tensor_Scalar bitwise_not_.default bitwise_or_.Scalar bitwise_or_.Tensor
bitwise_right_shift_.Tensor bitwise_right_shift_.Tensor_Scalar bitwise_xor_.Scalar
bitwise_xor_.Tensor ceil_.default celu_.default clamp_.Tensor clamp_.default clamp_max_.Tensor
clamp_max_.default clamp_min_.Tensor clamp_min_.default clip_.Tensor clip_.default
conj_physical_.default copy_.default copysign_.Scalar copysign_.Tensor cos_.default
cosh_.default cumsum_.default deg2rad_.default detach_.default digamma_.default div_.Scalar
div_.Scalar_mode div_.Tensor div_.Tensor_mode divide_.Scalar divide_.Scalar_mode divide_.Tensor
divide_.Tensor_mode dropout_.default elu_.default eq_.Scalar eq_.Tensor erf_.default
erfc_.default erfinv_.default exp2_.default exp_.default expm1_.default fill_.Scalar
fill_.Tensor fix_.default float_power_.Scalar float_power_.Tensor floor_.default
floor_divide_.Scalar fmod_.Scalar fmod_.Tensor frac_.default gcd_.default ge_.Scalar ge_.Tensor
gelu_.default greater_.Scalar greater_.Tensor greater_equal_.Scalar greater_equal_.Tensor
gt_.Scalar gt_.Tensor hardsigmoid_.default hardswish_.default hardtanh_.default
heaviside_.default hypot_.default i0_.default igamma_.default igammac_.default
index_add_.default index_copy_.default index_fill_.int_Scalar index_fill_.int_Tensor
index_put_.default lcm_.default ldexp_.default le_.Scalar le_.Tensor leaky_relu_.default
lerp_.Scalar lerp_.Tensor less_.Scalar less_.Tensor less_equal_.Scalar less_equal_.Tensor
lgamma_.default log10_.default log1p_.default log2_.default log_.default logical_and_.default
logical_not_.default logical_or_.default logical_xor_.default logit_.default lt_.Scalar
lt_.Tensor masked_fill_.Scalar masked_fill_.Tensor masked_scatter_.default mish_.default
mul_.Scalar mul_.Tensor multiply_.Scalar multiply_.Tensor mvlgamma_.default nan_to_num_.default
ne_.Scalar ne_.Tensor neg_.default negative_.default nextafter_.default not_equal_.Scalar
not_equal_.Tensor polygamma_.default pow_.Scalar pow_.Tensor rad2deg_.default
reciprocal_.default relu6_.default relu_.default remainder_.Scalar remainder_.Tensor
renorm_.default resize_.default resize_as_.default round_.decimals round_.default rrelu_.default
rsqrt_.default scatter_.src scatter_.value scatter_add_.default scatter_reduce_.two
selu_.default sgn_.default sigmoid_.default sign_.default silu_.default sin_.default
sinc_.default sinh_.default sqrt_.default square_.default squeeze_.default squeeze_.dim
squeeze_.dims sub_.Scalar sub_.Tensor subtract_.Scalar subtract_.Tensor t_.default tan_.default
tanh_.default threshold_.default tril_.default triu_.default true_divide_.Scalar
true_divide_.Tensor trunc_.default unsqueeze_.default xlogy_.Scalar_Other xlogy_.Tensor
zero_.default
"""

_VIEWS = """
_reshape_alias.default alias.default as_strided.default contiguous.default detach.default
diagonal.default expand.default permute.default positive.default select.int slice.Tensor
squeeze.default squeeze.dim squeeze.dims t.default to.device to.dtype to.dtype_layout to.other
to.prim_Device to.prim_dtype to.prim_other transpose.int unflatten.int unsqueeze.default
view.default
"""

ALLOWED_OPS = frozenset(_PURE.split())
"""``aten`` overloads (``<op>.<overload>``) a program may call."""
INPLACE_OPS = frozenset(_INPLACE.split())
"""``aten`` overloads that write their ``self`` (and nothing else)."""
VIEW_OPS = frozenset(_VIEWS.split())
"""``aten`` overloads whose result aliases their ``self``."""
