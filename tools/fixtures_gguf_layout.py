"""GGUF fixtures of the two newer llama.cpp architectures, written here in llama.cpp's layout.

gguf-py 0.19.0 (the pip package) knows `qwen35moe` and `glm-dsa`, but the llama.cpp
checkout the other fixtures were made with predates their converter classes, so
make_gguf_fixtures.py writes these two itself with gguf-py's writer, doing what
llama.cpp's convert_hf_to_gguf.py does for them (conversion/qwen.py: Qwen3_5MoeTextModel
= _Qwen35MtpMixin + _Qwen35MRopeMixin + _LinearAttentionVReorderBase over Qwen3NextModel
and Qwen2MoeModel; conversion/glm.py: GlmMoeDsaModel over DeepseekV2Model; read at
ggml-org/llama.cpp master, late 2026). No llama.cpp code is used; every step is written
out below from what that converter does to each tensor:

qwen35moe (from the multimodal qwen3_5_moe checkpoint: the language model under
`model.language_model.`, its config under `text_config`; the vision tower and `mtp.*` are
not written, as `--no-mtp` and a text GGUF leave them out):
  - in_proj_qkv -> attn_qkv, in_proj_z -> attn_gate, in_proj_b -> ssm_beta,
    in_proj_a -> ssm_alpha, out_proj -> ssm_out, conv1d -> ssm_conv1d (squeezed),
    dt_bias -> ssm_dt.bias, A_log -> ssm_a = -exp(A_log),
    linear_attn.norm -> ssm_norm;
  - with fewer key heads than value heads, the value heads are reordered from grouped by
    key head (g0v0, g0v1, ..., g1v0, ...) to tiled (g0v0, g1v0, ..., g0v1, ...) in the v
    rows of in_proj_qkv and the v channels of conv1d, the rows of in_proj_z, in_proj_b,
    in_proj_a, A_log and dt_bias, and the columns of out_proj;
  - every RMSNorm weight but linear_attn.norm stored plus one;
  - experts.gate_up_proj ([E, 2I, H]) split into ffn_gate_exps and ffn_up_exps;
  - metadata: qwen3next's keys, plus rope.dimension_sections (mrope_section, padded to 4).
glm-dsa (deepseek2's layout): kv_b_proj split per head into attn_k_b (transposed) and
  attn_v_b, num_key_value_heads written as 1 (MQA over the latent), the indexer's tensors
  under blk.N.indexer.{attn_q_b, attn_k, k_norm, proj}, and the keys
  glm-dsa.attention.indexer.{head_count, key_length, top_k, types} (types: one bool per
  layer, true for a "full" indexer, as the converter's add_indexer_types writes it).

As llama.cpp's converter, every tensor is first widened to f32 (its prepare_tensors does
so for any type other than f16 / f32), the arithmetic above is done in f32, and the
types are as its --outtype bf16 leaves them: 1-D tensors, routers
(ffn_gate_inp, ffn_gate_inp_shexp), ssm_conv1d, ssm_a and ssm_dt in F32, every other
matrix BF16. The tokenizer metadata is that of qwen3next-bf16.gguf (llama.cpp's writing of
the same shared GPT-2 tokenizer), its [PADn] entries extended to the vocabulary size.
"""

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open


def _load(src: Path) -> dict:
    out = {}
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(f, "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k).to(torch.float32)
    return out


def _tokenizer(w, vocab: int, tok_src: Path) -> None:
    import gguf

    r = gguf.GGUFReader(tok_src)
    for f in r.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        v = f.contents()
        if f.name == "tokenizer.ggml.tokens":
            base = [t for t in v if not t.startswith("[PAD")]
            v = base + [f"[PAD{i}]" for i in range(len(base), vocab)]
        elif f.name == "tokenizer.ggml.token_type":
            n_real = len([t for t in r.fields["tokenizer.ggml.tokens"].contents() if not t.startswith("[PAD")])
            v = v[:n_real] + [int(gguf.TokenType.UNUSED)] * (vocab - n_real)
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, v, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, v, vt)


F32_NAMES = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias")


def _add(w, name: str, t: torch.Tensor) -> None:
    import gguf

    if t.dim() == 1 or name.endswith(F32_NAMES):
        w.add_tensor(name, t.to(torch.float32).contiguous().numpy())
    else:
        raw = t.to(torch.bfloat16).contiguous().view(torch.uint16).numpy().view(np.uint8)
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)


def _common(w, arch: str, c: dict, name: str) -> None:
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if "intermediate_size" in c:
        w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_rope_freq_base(c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_file_type(32)  # MOSTLY_BF16


def _tiled(t: torch.Tensor, dim: int, nk: int, per_k: int, hd: int) -> torch.Tensor:
    """Value heads grouped by key head -> tiled (convert_hf_to_gguf's _reorder_v_heads)."""
    shape = list(t.shape)
    new = shape[:dim] + [nk, per_k, hd] + shape[dim + 1 :]
    return t.reshape(new).transpose(dim, dim + 1).contiguous().reshape(shape)


def write_qwen35moe(src: Path, out: Path, tok_src: Path) -> None:
    import gguf

    full = json.loads((src / "config.json").read_text())
    c = full["text_config"]
    hf = _load(src)
    w = gguf.GGUFWriter(out, "qwen35moe")
    _common(w, "qwen35moe", c, "Qwen3_5_Moe")
    a = "qwen35moe"
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    hk, hv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(hk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(hv * nv)
    w.add_array(f"{a}.attention.recurrent_layers", [t == "linear_attention" for t in c["layer_types"]])
    w.add_full_attention_interval(c.get("full_attention_interval", 4))
    rp = c["rope_parameters"]
    w.add_rope_dimension_count(int(c["head_dim"] * rp.get("partial_rotary_factor", 0.25)))
    sections = list(rp.get("mrope_section", [11, 11, 10]))
    w.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    _tokenizer(w, c["vocab_size"], tok_src)

    per_k = nv // nk
    reorder = nk != nv
    plus1 = lambda t: t + 1  # noqa: E731 (in f32, as the converter)
    pre = "model.language_model."
    _add(w, "token_embd.weight", hf[pre + "embed_tokens.weight"])
    _add(w, "output.weight", hf["lm_head.weight"])
    _add(w, "output_norm.weight", plus1(hf[pre + "norm.weight"]))
    for l, kind in enumerate(c["layer_types"]):
        p, b = f"{pre}layers.{l}.", f"blk.{l}."
        _add(w, b + "attn_norm.weight", plus1(hf[p + "input_layernorm.weight"]))
        _add(w, b + "post_attention_norm.weight", plus1(hf[p + "post_attention_layernorm.weight"]))
        if kind == "full_attention":
            s = p + "self_attn."
            for hfn, gn in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
                _add(w, b + gn + ".weight", hf[s + hfn + ".weight"])
            _add(w, b + "attn_q_norm.weight", plus1(hf[s + "q_norm.weight"]))
            _add(w, b + "attn_k_norm.weight", plus1(hf[s + "k_norm.weight"]))
        else:
            s = p + "linear_attn."
            qkv, z = hf[s + "in_proj_qkv.weight"], hf[s + "in_proj_z.weight"]
            bb, aa = hf[s + "in_proj_b.weight"], hf[s + "in_proj_a.weight"]
            conv, a_log, dt = hf[s + "conv1d.weight"].squeeze(), hf[s + "A_log"], hf[s + "dt_bias"]
            out_proj = hf[s + "out_proj.weight"]
            if reorder:
                qk = 2 * nk * hk
                qkv = torch.cat([qkv[:qk], _tiled(qkv[qk:], 0, nk, per_k, hv)])
                conv = torch.cat([conv[:qk], _tiled(conv[qk:], 0, nk, per_k, hv)])
                z = _tiled(z, 0, nk, per_k, hv)
                bb, aa = _tiled(bb, 0, nk, per_k, 1), _tiled(aa, 0, nk, per_k, 1)
                a_log = _tiled(a_log.unsqueeze(-1), 0, nk, per_k, 1).squeeze(-1)
                dt = _tiled(dt.unsqueeze(-1), 0, nk, per_k, 1).squeeze(-1)
                out_proj = _tiled(out_proj, 1, nk, per_k, hv)
            _add(w, b + "attn_qkv.weight", qkv)
            _add(w, b + "attn_gate.weight", z)
            _add(w, b + "ssm_beta.weight", bb)
            _add(w, b + "ssm_alpha.weight", aa)
            _add(w, b + "ssm_conv1d.weight", conv)
            _add(w, b + "ssm_a", -torch.exp(a_log))
            _add(w, b + "ssm_dt.bias", dt)
            _add(w, b + "ssm_norm.weight", hf[s + "norm.weight"])
            _add(w, b + "ssm_out.weight", out_proj)
        m = p + "mlp."
        gu = hf[m + "experts.gate_up_proj"]
        i = gu.shape[1] // 2
        _add(w, b + "ffn_gate_inp.weight", hf[m + "gate.weight"])
        _add(w, b + "ffn_gate_exps.weight", gu[:, :i, :])
        _add(w, b + "ffn_up_exps.weight", gu[:, i:, :])
        _add(w, b + "ffn_down_exps.weight", hf[m + "experts.down_proj"])
        for part in ["gate", "up", "down"]:
            _add(w, b + f"ffn_{part}_shexp.weight", hf[m + f"shared_expert.{part}_proj.weight"])
        _add(w, b + "ffn_gate_inp_shexp.weight", hf[m + "shared_expert_gate.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_glm_dsa(src: Path, out: Path, tok_src: Path) -> None:
    import gguf

    c = json.loads((src / "config.json").read_text())
    hf = _load(src)
    a = "glm-dsa"
    w = gguf.GGUFWriter(out, a)
    _common(w, a, c, "Glm_Moe_Dsa")
    heads, nope, rope, vd, lora = (
        c["num_attention_heads"],
        c["qk_nope_head_dim"],
        c["qk_rope_head_dim"],
        c["v_head_dim"],
        c["kv_lora_rank"],
    )
    w.add_head_count_kv(1)  # MLA written as MQA over the latent
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_group_count(c.get("n_group", 1))
    w.add_expert_group_used_count(c.get("topk_group", 1))
    w.add_key_length(lora + rope)
    w.add_value_length(lora)
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_vocab_size(c["vocab_size"])
    w.add_q_lora_rank(c["q_lora_rank"])
    w.add_kv_lora_rank(lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(vd)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    if c.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    w.add_indexer_head_count(c["index_n_heads"])
    w.add_indexer_key_length(c["index_head_dim"])
    w.add_indexer_top_k(c["index_topk"])
    w.add_array(f"{a}.attention.indexer.types", [t == "full" for t in c["indexer_types"]])
    _tokenizer(w, c["vocab_size"], tok_src)

    _add(w, "token_embd.weight", hf["model.embed_tokens.weight"])
    _add(w, "output.weight", hf["lm_head.weight"])
    _add(w, "output_norm.weight", hf["model.norm.weight"])
    for l in range(c["num_hidden_layers"]):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        s = p + "self_attn."
        _add(w, b + "attn_norm.weight", hf[p + "input_layernorm.weight"])
        _add(w, b + "ffn_norm.weight", hf[p + "post_attention_layernorm.weight"])
        for hfn, gn in [
            ("q_a_proj.weight", "attn_q_a.weight"),
            ("q_a_layernorm.weight", "attn_q_a_norm.weight"),
            ("q_b_proj.weight", "attn_q_b.weight"),
            ("kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"),
            ("kv_a_layernorm.weight", "attn_kv_a_norm.weight"),
            ("o_proj.weight", "attn_output.weight"),
        ]:
            _add(w, b + gn, hf[s + hfn])
        kv_b = hf[s + "kv_b_proj.weight"].view(heads, nope + vd, lora)
        k_b, v_b = torch.split(kv_b, [nope, vd], dim=1)
        _add(w, b + "attn_k_b.weight", k_b.transpose(1, 2))
        _add(w, b + "attn_v_b.weight", v_b)
        if (s + "indexer.wk.weight") in hf:
            for hfn, gn in [
                ("wq_b.weight", "attn_q_b.weight"),
                ("wk.weight", "attn_k.weight"),
                ("k_norm.weight", "k_norm.weight"),
                ("k_norm.bias", "k_norm.bias"),
                ("weights_proj.weight", "proj.weight"),
            ]:
                _add(w, b + "indexer." + gn, hf[s + "indexer." + hfn])
        m = p + "mlp."
        if l < c["first_k_dense_replace"]:
            for part in ["gate", "up", "down"]:
                _add(w, b + f"ffn_{part}.weight", hf[m + f"{part}_proj.weight"])
            continue
        _add(w, b + "ffn_gate_inp.weight", hf[m + "gate.weight"])
        _add(w, b + "exp_probs_b.bias", hf[m + "gate.e_score_correction_bias"])
        for part in ["gate", "up", "down"]:
            stacked = torch.stack([hf[m + f"experts.{e}.{part}_proj.weight"] for e in range(c["n_routed_experts"])])
            _add(w, b + f"ffn_{part}_exps.weight", stacked)
            _add(w, b + f"ffn_{part}_shexp.weight", hf[m + f"shared_experts.{part}_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
