"""The launchers each CPU/CUDA pair of kernel modules exposes under the same names.

``nnkit._backend.kernels_for(cpu, cuda, x)`` hands the kernels above one module or the other
by the array's device, so the names they call must exist in both: one row a pair, keyed by
the two module names as ``kernels_for`` takes them. Each module's ``__all__`` starts with its
row; tests/test_one_backend_choice.py checks that both modules define every name.
"""

LAUNCHERS = {
    ("activation_cpu", "activation_cuda"):
        ("gelu_forward", "gelu_backward", "gelu_tanh_forward", "gelu_tanh_backward",
         "dropout_forward"),
    ("attention_cpu", "attention_cuda"):
        ("attention_forward", "attention_backward", "fill_dropout_multipliers"),
    ("elementwise_cpu", "elementwise_cuda"):
        ("expit", "scatter_add", "full_scalar", "to_device_of", "uniform"),
    ("hopfield_cpu", "hopfield_cuda"): ("sync_run", "async_run", "init_fields"),
    ("layer_norm_cpu", "layer_norm_cuda"): ("layer_norm_rows", "layer_norm_backward_rows"),
    ("linear_attention_cpu", "linear_attention_cuda"): ("recurrent_forward", "recurrent_backward"),
    ("optim_cpu", "optim_cuda"): ("FUSED", "adam_step"),
    ("recurrent_cpu", "recurrent_cuda"):
        ("rnn_forward_layer", "rnn_backward_layer", "lstm_forward_layer", "lstm_backward_layer",
         "gru_forward_layer", "gru_backward_layer"),
    ("scan_cpu", "scan_cuda"): ("linear_scan", "linear_scan_backward"),
    ("selective_scan_cpu", "selective_scan_cuda"):
        ("selective_scan_forward", "selective_scan_backward"),
    ("softmax_cpu", "softmax_cuda"):
        ("softmax_rows", "log_softmax_rows", "softmax_backward_rows",
         "log_softmax_backward_rows", "cross_entropy_rows", "cross_entropy_backward_rows",
         "cross_entropy_mean", "cross_entropy_mean_backward_rows", "first_invalid_target"),
    ("nnkit.kernels.conv.cpu", "conv_cuda"):
        ("conv2d_forward", "conv2d_backward", "release", "max_pool", "max_pool_backward",
         "avg_pool", "avg_pool_backward"),
}


def launchers(cpu: str, cuda: str) -> list[str]:
    """The names both modules of the pair ``(cpu, cuda)`` define."""
    return list(LAUNCHERS[(cpu, cuda)])
