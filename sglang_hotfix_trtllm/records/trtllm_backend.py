"""The names the records give SGLang's TRT-LLM MHA backend: its module, its class, and the two
FlashInfer kernels its methods call. Standard library only."""

MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
CLASS_NAME = "TRTLLMHAAttnBackend"
KERNELS = {"decode": "trtllm_batch_decode_with_kv_cache", "prefill": "trtllm_batch_context_with_kv_cache"}
