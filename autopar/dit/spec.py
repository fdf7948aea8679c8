"""The normalized description of a diffusion transformer: blocks, patchify, VAE and text encoders.

A model is a pattern of block kinds (``arch``): ``mmdit`` (double-stream blocks with separate image
and text weights, then single-stream blocks: FLUX, SD3, HunyuanVideo, Open-Sora 2.0), ``cross``
(self-attention over the video plus cross-attention to the text: Wan, PixArt, Step-Video, SANA's
linear attention), ``stdit`` (factorized spatial/temporal attention: STDiT, Open-Sora 1.x),
``cogvideo`` (one joint stream whose weights text and video share, expert adaLN: CogVideoX) and
``asym`` (Mochi's asymmetric streams: a narrow text stream attends jointly with a wide visual one) and
``single`` (Z-Image's single-stream DiT: one stream of shared weights over the image and caption
tokens, a 4-way modulation, and refiner blocks that run on the image tokens and on the caption
tokens alone before the main blocks).
Each block is listed as its linear layers (which stream they read, in x out), its adaLN modulation
(applied to the conditioning vector only: parameters, no token FLOPs) and its attention ops, so
parameter counts, FLOPs and the layouts' splits all follow from one list.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from autopar.errors import ModelConfigError, UnsupportedArchitecture
from autopar.limits import MAX_DIT_LAYERS, MAX_DIT_WIDTH, echo

Arch = Literal["mmdit", "cross", "stdit", "cogvideo", "asym", "single"]
Stream = Literal["img", "txt", "joint", "ictx"]  # ictx: image-condition tokens (Wan I2V CLIP)
# txt_self: a refiner's self-attention over the caption tokens alone (Z-Image context refiner)
AttnKind = Literal["joint", "self", "cross", "cross_image", "spatial", "temporal", "linear", "txt_self"]
ARCHES: tuple[str, ...] = ("mmdit", "cross", "stdit", "cogvideo", "asym", "single")


@dataclass(frozen=True)
class Linear:
    """``count`` linear layers per model reading ``stream`` tokens: ``k_in`` x ``n_out`` (+ bias)."""

    stream: Stream
    k_in: int
    n_out: int
    count: int
    bias: bool = True

    @property
    def params(self) -> int:
        return self.count * (self.k_in * self.n_out + (self.n_out if self.bias else 0))


@dataclass(frozen=True)
class Attention:
    """``count`` attention ops of ``kind`` with ``heads`` x ``head_dim`` (q and kv lengths from the sample)."""

    kind: AttnKind
    count: int
    heads: int
    head_dim: int


@dataclass(frozen=True)
class VAESpec:
    """A (video) VAE: strides, latent channels and the decoder's conv pyramid (for FLOPs/memory)."""

    name: str
    spatial: int  # pixels per latent pixel along height and width
    temporal: int  # frames per latent frame after the first (causal video VAEs); 1: image VAE
    channels: int  # latent channels
    block_out_channels: tuple[int, ...]  # encoder order, full resolution first (diffusers)
    layers_per_block: int
    conv3d: bool  # 3x3x3 kernels (video) or 3x3 (image, or a video VAE decoding frame by frame)
    source: str
    causal: bool = True  # a causal video VAE: the first frame alone, then ``temporal`` frames per latent
    # the convolutions run on pixel_patch x pixel_patch blocks of pixels (LTX-Video's VAE: 4), so its
    # finest level is at 1/pixel_patch of the output resolution
    pixel_patch: int = 1

    def latent_frames(self, frames: int) -> int:
        """Causal video VAEs keep the first frame: (frames - 1) / temporal + 1; they take
        1 + k x temporal frames (Wan, HunyuanVideo, CogVideoX: 4k + 1, e.g. 81), anything else is refused."""
        if self.temporal == 1:
            return frames
        if self.causal and (frames - 1) % self.temporal:
            k = (frames - 1) // self.temporal
            near = sorted({1 + k * self.temporal, 1 + (k + 1) * self.temporal})
            raise ModelConfigError(
                f"{self.name} encodes 1 + k x {self.temporal} frames; {frames} frames is not one of them",
                f"pass --frames {' or '.join(str(n) for n in near)}",
            )
        return (frames - 1) // self.temporal + 1

    def decode_flops(self, frames: int, height: int, width: int) -> float:
        """Convolution FLOPs of decoding one sample: mid block + up blocks of (layers_per_block + 1)
        resnets (2 convs each) + one upsampling conv per level, 2 x taps x c_in x c_out per voxel."""
        taps = 27.0 if self.conv3d else 9.0
        chs = list(reversed(self.block_out_channels))
        n = len(chs)
        t_ups = int(round(math.log2(self.temporal))) if self.temporal > 1 else 0
        out_vox = float(frames) * height * width / self.pixel_patch**2

        def vox(level: int) -> float:  # output voxels processed at decoder level (0 = lowest res)
            spatial = 4.0 ** -(n - 1 - level)
            temporal = 2.0 ** -max(0, t_ups - level)
            return out_vox * spatial * temporal

        def conv(cin: int, cout: int) -> float:
            return 2.0 * taps * cin * cout

        total = 4 * conv(chs[0], chs[0]) * vox(0)  # mid block: 2 resnets
        for i, c in enumerate(chs):
            cin = chs[i - 1] if i else chs[0]
            if i:
                total += conv(cin, cin) * vox(i)  # upsampling conv at the new resolution
            total += (conv(cin, c) + conv(c, c) + 2 * self.layers_per_block * conv(c, c)) * vox(i)
        return total

    def encode_flops(self, frames: int, height: int, width: int) -> float:
        """Encoders hold layers_per_block resnets per level (decoders one more)."""
        lpb = self.layers_per_block
        return self.decode_flops(frames, height, width) * lpb / (lpb + 1)

    def decode_activation_bytes(self, frames: int, height: int, width: int, *, tile: int = 0) -> float:
        """Peak decoder activation: ~3 live full-resolution tensors of the last level (bf16).

        ``tile``: spatial tile edge in pixels (0: untiled); tiles decode one after another."""
        h, w = (min(height, tile), min(width, tile)) if tile else (height, width)
        f = min(frames, 4 * self.temporal + 1) if tile and self.temporal > 1 else frames
        return 3.0 * 2.0 * self.block_out_channels[0] * f * h * w / self.pixel_patch**2


@dataclass(frozen=True)
class TextEncoder:
    """A text encoder run once per prompt (and once for the negative prompt under CFG)."""

    name: str
    params: float
    tokens: int
    source: str

    def flops(self) -> float:
        return 2.0 * self.params * self.tokens


@dataclass(frozen=True)
class DiTSpec:
    """One diffusion transformer, normalized (see the module docstring for ``arch``)."""

    id: str
    name: str
    arch: Arch
    hidden: int
    heads: int
    head_dim: int
    ffn: int
    layers: int  # blocks of the main kind (mmdit: double-stream blocks)
    single_layers: int  # mmdit: single-stream blocks after the double-stream ones
    patch: tuple[int, int, int]  # (p_t, p_h, p_w)
    in_channels: int  # channels the patch embedding reads (latent + any concatenated condition)
    text_dim: int  # caption features entering the model (T5-XXL: 4096)
    text_tokens: int  # caption tokens the DiT attends to
    vae: VAESpec
    text_encoders: tuple[TextEncoder, ...]
    cfg: bool  # inference runs classifier-free guidance (a conditional and an unconditional pass)
    ffn_kind: Literal["gelu", "swiglu", "glumb"] = "gelu"
    cond_dim: int = 0  # width of the modulation input (0: hidden)
    text_hidden: int = 0  # asym: width of the text stream
    text_ffn: int = 0  # asym: text-stream FFN hidden
    pooled_dim: int = 0  # pooled text vector (CLIP) entering the conditioning, 0: none
    guidance_embed: bool = False  # guidance-distilled: guidance scale embedded, no CFG pass
    context_pre_only_last: bool = False  # the last block does not update the text stream (SD3, Mochi)
    refiner_layers: int = 0  # HunyuanVideo token refiner blocks over the text
    # mmdit blocks with a second, image-only self-attention (SD3.5 MMDiT-X: diffusers
    # SD3Transformer2DModel ``dual_attention_layers``; JointTransformerBlock ``attn2`` and a
    # 9-way SD35AdaLayerNormZeroX modulation instead of the 6-way AdaLayerNormZero)
    dual_attention_layers: int = 0
    pos_embed_tokens: int = 0  # SD3 PatchEmbed table of pos_embed_max_size^2 positions (stored, fixed)
    self_attention: Literal["softmax", "linear"] = "softmax"
    # image conditioning (Wan 2.1 I2V/FLF2V): CLIP image features of image_dim enter through an
    # image embedder (LayerNorm, GELU MLP, LayerNorm) as image_tokens extra cross-attention keys with
    # their own K/V projections (added_kv_dim -> inner, + RMSNorm on K) in every block
    image_dim: int = 0
    image_tokens: int = 0
    added_kv_dim: int = 0
    # single (Z-Image): refiner blocks over the image tokens alone (with modulation) and over the
    # caption tokens alone (without), run once per forward before the main blocks
    img_refiner_layers: int = 0
    txt_refiner_layers: int = 0
    # single: key/value heads of the blocks' attention (0: heads; Lumina 2 is grouped-query)
    kv_heads: int = 0
    # mmdit: one modulation per stream shared by every block (FLUX.2: double_stream_modulation_img /
    # _txt, single_stream_modulation, from the hidden-wide time embedding, no bias), not one per block
    shared_modulation: bool = False
    linear_bias: bool = True  # the attention projections carry a bias (Z-Image's, Stable Audio's do not)
    ffn_bias: bool = True  # the FFN's linear layers carry a bias (Z-Image's do not)
    # cross: the caption's key/value projections read cross_kv_dim-wide features (0: hidden) into
    # cross_kv_heads heads (0: heads; Stable Audio's cross-attention is grouped-query)
    cross_kv_dim: int = 0
    cross_kv_heads: int = 0
    adaln: bool = True  # False: no modulation in the blocks (Stable Audio: a prepended global token)
    # audio DiT (Stable Audio): every forward denoises this fixed window of latents, whatever length
    # is asked for (diffusers StableAudioPipeline runs the config's sample_size and trims the
    # waveform), after prefix_tokens conditioning tokens; image/video requests do not apply
    audio_latents: int = 0
    prefix_tokens: int = 0
    # class-specific embedders and output layer, counted by the class reader from its config (0: the
    # arch's formula in embedding_params)
    embed_params: int = 0
    norm_count: int = 0  # the same for the norms' weights (0: the arch's formula in norm_params)
    published_params: float = 0.0
    published_source: str = ""
    source: str = ""
    defaults: dict[str, int] = field(default_factory=dict)  # resolution/frames/steps of its README

    # ---------------------------------------------------------------- structure
    @property
    def cond(self) -> int:
        return self.cond_dim or self.hidden

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def video(self) -> bool:
        return self.vae.temporal > 1 or self.arch == "stdit"

    @property
    def joint_stream(self) -> bool:
        """The caption tokens run through the blocks beside the image tokens (joint attention)."""
        return self.arch in ("mmdit", "asym", "cogvideo", "single")

    @property
    def refiner_blocks(self) -> int:
        """Z-Image refiner blocks (image-only and caption-only), run on every forward."""
        return self.img_refiner_layers + self.txt_refiner_layers

    @property
    def blocks(self) -> int:
        """Transformer blocks one forward runs (pipeline stages and per-block costs split these)."""
        return self.layers + self.single_layers + self.refiner_blocks

    def _ffn(self, stream: Stream, d: int, f: int, n: int) -> list[Linear]:
        b = self.ffn_bias
        if self.ffn_kind == "gelu":
            return [Linear(stream, d, f, n, b), Linear(stream, f, d, n, b)]
        return [Linear(stream, d, 2 * f, n, b), Linear(stream, f, d, n, b)]  # gated: up+gate fused

    def _single_block(self, stream: Stream, n: int) -> list[Linear]:
        """Z-Image / Lumina 2 block: to_q/k/v, to_out and a SwiGLU FFN (w1, w3 fused; w2), on one stream."""
        d, b = self.hidden, self.linear_bias
        qkv = self.inner + 2 * (self.kv_heads or self.heads) * self.head_dim
        return [Linear(stream, d, qkv, n, b), Linear(stream, self.inner, d, n, b)] + self._ffn(
            stream, d, self.ffn, n
        )

    def block_linears(self) -> list[Linear]:
        """Every linear layer of the transformer blocks (token FLOPs and TP splits follow these)."""
        d, f, L, a = self.hidden, self.ffn, self.layers, self.arch
        if a == "mmdit":
            last, b = (1 if self.context_pre_only_last else 0), self.linear_bias
            out = [Linear("img", d, 3 * self.inner, L, b), Linear("img", self.inner, d, L, b)]
            out += self._ffn("img", d, f, L)
            out += [Linear("txt", d, 3 * self.inner, L, b), Linear("txt", self.inner, d, L - last, b)]
            out += self._ffn("txt", d, f, L - last)
            if self.dual_attention_layers:  # attn2: to_q/k/v and to_out on the image stream
                n2 = self.dual_attention_layers
                out += [Linear("img", d, 3 * self.inner, n2, b), Linear("img", self.inner, d, n2, b)]
            if self.single_layers:  # parallel blocks: qkv + FFN in (x 2 gated), attention + FFN out
                S, g = self.single_layers, (f if self.ffn_kind == "gelu" else 2 * f)
                out += [
                    Linear("joint", d, 3 * self.inner + g, S, b),
                    Linear("joint", self.inner + f, d, S, b),
                ]
            return out
        if a == "cross":
            image = [Linear("ictx", self.added_kv_dim, 2 * self.inner, L)] if self.added_kv_dim else []
            b, kv = self.linear_bias, (self.cross_kv_heads or self.heads) * self.head_dim
            return [
                Linear("img", d, 3 * self.inner, L, b),
                Linear("img", self.inner, d, L, b),
                Linear("img", d, self.inner, L, b),  # cross-attention query
                Linear(
                    "txt", self.cross_kv_dim or d, 2 * kv, L, b
                ),  # cross-attention key/value of the caption
                *image,  # diffusers WanAttention add_k_proj / add_v_proj (I2V)
                Linear("img", self.inner, d, L, b),
                *self._ffn("img", d, f, L),
            ]
        if a == "stdit":
            return [
                Linear("img", d, 3 * self.inner, 2 * L),  # spatial and temporal self-attention
                Linear("img", self.inner, d, 2 * L),
                Linear("img", d, self.inner, L),
                Linear("txt", d, 2 * self.inner, L),
                Linear("img", self.inner, d, L),
                *self._ffn("img", d, f, L),
            ]
        if a == "cogvideo":
            return [Linear("joint", d, 3 * self.inner, L), Linear("joint", self.inner, d, L)] + self._ffn(
                "joint", d, f, L
            )
        if a == "single":
            out = self._single_block("joint", L)
            if self.img_refiner_layers:
                out += self._single_block("img", self.img_refiner_layers)
            if self.txt_refiner_layers:
                out += self._single_block("txt", self.txt_refiner_layers)
            return out
        # asym (Mochi): visual stream d, text stream dy; attention runs at the visual width.
        dy, fy, last = self.text_hidden, self.text_ffn, 1 if self.context_pre_only_last else 0
        return [
            Linear("img", d, 3 * self.inner, L),
            Linear("img", self.inner, d, L),
            *self._ffn("img", d, f, L),
            Linear("txt", dy, 3 * self.inner, L),
            Linear("txt", self.inner, dy, L - last),
            *self._ffn("txt", dy, fy, L - last),
        ]

    def modulation_params(self) -> int:
        """adaLN modulation (linear on the conditioning vector) or adaLN-single tables."""
        d, c, L = self.hidden, self.cond, self.layers
        if self.arch == "mmdit" and self.shared_modulation:
            return 2 * c * 6 * d + (c * 3 * d if self.single_layers else 0)
        if self.arch == "mmdit":
            last = 1 if self.context_pre_only_last else 0
            dbl = L * 2 * (c * 6 * d + 6 * d) - last * (c * 4 * d + 4 * d)
            dual = self.dual_attention_layers * (c * 3 * d + 3 * d)  # 9 modulation vectors, not 6
            return dbl + dual + self.single_layers * (c * 3 * d + 3 * d)
        if self.arch == "cogvideo":
            return L * 2 * (c * 6 * d + 6 * d)
        if self.arch == "single":  # scale/gate of attention and FFN; the caption refiner has none
            return (L + self.img_refiner_layers) * (c * 4 * d + 4 * d)
        if self.arch == "asym":
            dy = self.text_hidden
            return L * (c * 4 * d + 4 * d + c * 4 * dy + 4 * dy)
        if not self.adaln:
            return 0
        return L * 6 * d  # adaLN-single: one shared projection (counted in embeddings) + a table per block

    def attentions(self) -> list[Attention]:
        L, H, hd = self.layers, self.heads, self.head_dim
        if self.arch == "single":
            out = [Attention("joint", L, H, hd)]
            if self.img_refiner_layers:
                out.append(Attention("self", self.img_refiner_layers, H, hd))
            if self.txt_refiner_layers:
                out.append(Attention("txt_self", self.txt_refiner_layers, H, hd))
            return out
        if self.arch in ("mmdit", "cogvideo", "asym"):
            out = [Attention("joint", L + self.single_layers, H, hd)]
            if self.dual_attention_layers:
                out.append(Attention("self", self.dual_attention_layers, H, hd))
            return out
        if self.arch == "cross":
            kind: AttnKind = "linear" if self.self_attention == "linear" else "self"
            image = [Attention("cross_image", L, H, hd)] if self.added_kv_dim and self.image_tokens else []
            return [Attention(kind, L, H, hd), Attention("cross", L, H, hd), *image]
        return [Attention("spatial", L, H, hd), Attention("temporal", L, H, hd), Attention("cross", L, H, hd)]

    def embedding_params(self) -> int:
        """Patch embedding, caption projection, timestep/pooled/guidance MLPs, final layer."""
        if self.embed_params:
            return self.embed_params
        d, c = self.hidden, self.cond
        pt, ph, pw = self.patch
        patch_in = pt * ph * pw * self.in_channels
        patch_out = pt * ph * pw * self.vae.channels
        p = patch_in * d + d  # patch embedding
        p += self.pos_embed_tokens * d  # SD3: the position table the checkpoint stores
        tw = self.text_hidden or d
        p += self.text_dim * tw + tw  # caption projection
        if self.arch in ("cross", "stdit"):
            p += tw * tw + tw  # second caption-projection layer (Wan, PixArt, Step-Video)
        p += 256 * c + c + c * c + c  # sinusoidal timestep -> MLP
        if self.pooled_dim:
            p += self.pooled_dim * c + c + c * c + c
        if self.guidance_embed:
            p += 256 * c + c + c * c + c
        if self.arch in ("cross", "stdit"):
            p += c * 6 * d + 6 * d  # adaLN-single shared projection
        if self.arch == "cross":  # Wan, PixArt, SANA: the final shift/scale is a table (scale_shift_table)
            p += 2 * d + d * patch_out + patch_out
        else:  # final adaLN (conditioning -> shift, scale) + projection
            p += c * 2 * d + 2 * d + d * patch_out + patch_out
        if self.image_dim:  # diffusers WanImageEmbedding: LayerNorm, Linear+GELU, Linear, LayerNorm
            e = self.image_dim
            p += 2 * e + e * e + e + e * d + d + 2 * d
        if self.refiner_layers:  # HunyuanVideo individual token refiner (self-attn + MLP + adaLN)
            p += self.refiner_layers * (4 * d * d + 4 * d + 2 * 4 * d * d + 5 * d + d * 2 * d + 2 * d)
        return p

    def norm_params(self) -> int:
        """LayerNorm/RMSNorm weights (qk-norm, affine norms): small, counted for the 1% golden check."""
        if self.norm_count:
            return self.norm_count
        if self.arch == "single":  # four RMSNorm(hidden) around attention and FFN + RMSNorm q/k per block
            return self.blocks * (4 * self.hidden + 2 * self.head_dim)
        per = 4 * self.head_dim  # q/k norms of the image and text streams
        added = self.layers * self.inner if self.added_kv_dim else 0  # norm_added_k (Wan I2V)
        return (
            (self.layers + self.single_layers) * per + self.dual_attention_layers * 2 * self.head_dim + added
        )

    def params_breakdown(self) -> dict[str, int]:
        blocks = sum(lin.params for lin in self.block_linears())
        return {
            "blocks_linear": blocks,
            "modulation": self.modulation_params(),
            "embeddings": self.embedding_params(),
            "norms": self.norm_params(),
        }

    @property
    def params(self) -> int:
        return sum(self.params_breakdown().values())

    @property
    def buffer_params(self) -> int:
        """Stored but not trained: SD3's fixed position table (a diffusers buffer, in the checkpoint)."""
        return self.pos_embed_tokens * self.hidden

    @property
    def trainable_params(self) -> int:
        return self.params - self.buffer_params

    # ---------------------------------------------------------------- the request -> tokens
    def latent_shape(self, height: int, width: int, frames: int) -> tuple[int, int, int]:
        """(latent frames, latent height, latent width) of one sample."""
        s = self.vae.spatial
        if height % s or width % s:
            raise ModelConfigError(
                f"{self.id}: resolution {width}x{height} is not a multiple of the VAE's spatial stride {s}",
                f"pick a width and height divisible by {s * self.patch[1]}",
            )
        return self.vae.latent_frames(frames), height // s, width // s

    def token_grid(self, height: int, width: int, frames: int) -> tuple[int, int, int]:
        """(frames, rows, columns) of transformer tokens after patchify (p_t, p_h, p_w)."""
        if self.audio_latents:
            raise ModelConfigError(
                f"{self.id} is an audio DiT: every forward denoises its window of {self.audio_latents} latents, "
                "so a height x width x frames request does not apply and autopar dit generate/train do not cost it",
                "autopar dit model CONFIG prints its parameters and the FLOPs of one forward",
            )
        t, h, w = self.latent_shape(height, width, frames)
        pt, ph, pw = self.patch
        if h % ph or w % pw:
            raise ModelConfigError(
                f"{self.id}: latent {w}x{h} is not divisible by the patch {ph}x{pw}",
                f"pick a width and height divisible by {self.vae.spatial * ph}",
            )
        return math.ceil(t / pt), h // ph, w // pw

    def tokens(self, height: int, width: int, frames: int) -> int:
        """Image/video tokens per sample (text tokens not included)."""
        t, h, w = self.token_grid(height, width, frames)
        return t * h * w

    # ---------------------------------------------------------------- FLOPs
    def forward_flops(self, height: int, width: int, frames: int) -> dict[str, float]:
        """FLOPs of one transformer forward on one sample: linear layers and attention (an audio DiT:
        its fixed window of latents plus its prefix tokens, whatever the request)."""
        if self.audio_latents:
            t, h, w = 1, 1, self.audio_latents + self.prefix_tokens
        else:
            t, h, w = self.token_grid(height, width, frames)
        s_img = float(t * h * w)
        s_txt = float(self.text_tokens)
        n = {"img": s_img, "txt": s_txt, "joint": s_img + s_txt, "ictx": float(self.image_tokens)}
        gemm = sum(2.0 * n[lin.stream] * lin.count * lin.k_in * lin.n_out for lin in self.block_linears())
        attn = 0.0
        for a in self.attentions():
            attn += a.count * attention_flops(a, s_img, s_txt, t, h * w, float(self.image_tokens))
        return {"gemm": gemm, "attention": attn}


def attention_flops(
    a: Attention, s_img: float, s_txt: float, frames: float, hw: float, s_ictx: float = 0.0
) -> float:
    """Forward FLOPs of one attention op: 4 x q_len x kv_len x heads x head_dim (QK^T and PV)."""
    width = a.heads * a.head_dim
    if a.kind == "cross_image":  # Wan I2V: image tokens attend the CLIP image tokens, a softmax apart
        return 4.0 * s_img * s_ictx * width
    if a.kind == "joint":
        return 4.0 * (s_img + s_txt) ** 2 * width
    if a.kind == "self":
        return 4.0 * s_img**2 * width
    if a.kind == "txt_self":
        return 4.0 * s_txt**2 * width
    if a.kind == "cross":
        return 4.0 * s_img * s_txt * width
    if a.kind == "linear":  # ReLU linear attention: K^T V then Q (K^T V), head_dim^2 per token
        return 4.0 * s_img * a.heads * a.head_dim**2
    if a.kind == "spatial":
        return 4.0 * frames * hw**2 * width
    return 4.0 * hw * frames**2 * width  # temporal


# ---------------------------------------------------------------------------------------- loading
def _data() -> dict[str, Any]:
    return _load_data()


@lru_cache(maxsize=1)
def _load_data() -> dict[str, Any]:
    text = (resources.files("autopar.dit") / "presets.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def list_dit_presets() -> list[str]:
    return sorted(_data()["models"])


def _vae(name: str) -> VAESpec:
    v = _data()["vaes"][name]
    return VAESpec(
        name=name,
        spatial=v["spatial"],
        temporal=v["temporal"],
        channels=v["channels"],
        block_out_channels=tuple(v["block_out_channels"]),
        layers_per_block=v["layers_per_block"],
        conv3d=v["conv3d"],
        source=v["source"],
        causal=v.get("causal", True),
        pixel_patch=v.get("pixel_patch", 1),
    )


def _encoder(name: str, tokens: int) -> TextEncoder:
    e = _data()["text_encoders"][name]
    return TextEncoder(name=name, params=float(e["params"]), tokens=tokens, source=e["source"])


_SPEC_KEYS = {
    "name", "arch", "hidden", "heads", "head_dim", "ffn", "layers", "single_layers", "patch",
    "in_channels", "text_dim", "text_tokens", "vae", "text_encoders", "cfg", "ffn_kind", "cond_dim",
    "text_hidden", "text_ffn", "pooled_dim", "guidance_embed", "context_pre_only_last",
    "refiner_layers", "self_attention", "published_params", "published_source", "source", "defaults",
    "dual_attention_layers", "pos_embed_tokens",
}  # fmt: skip


def _build(pid: str, m: dict[str, Any]) -> DiTSpec:
    kw = {k: v for k, v in m.items() if k in _SPEC_KEYS}
    kw["patch"] = tuple(m["patch"])
    kw["vae"] = _vae(m["vae"])
    kw["text_encoders"] = tuple(_encoder(n, m["text_tokens"]) for n in m["text_encoders"])
    kw.setdefault("single_layers", 0)
    return DiTSpec(id=pid, **kw)


def is_dit_preset(name: str) -> bool:
    return isinstance(name, str) and name.strip().lower() in _data()["models"]


def load_dit(name_or_path: str | os.PathLike[str]) -> DiTSpec:
    """A DiT preset id, or a diffusers transformer ``config.json`` (file or its folder)."""
    key = os.fspath(name_or_path)
    models = _data()["models"]
    if key.strip().lower() in models:
        return _build(key.strip().lower(), models[key.strip().lower()])
    path = Path(key).expanduser()
    if not path.exists():
        raise ModelConfigError(
            f"unknown DiT model {key!r}: not a preset and not a file",
            f"presets: {', '.join(list_dit_presets())}, or a diffusers transformer config.json",
        )
    from autopar.model import read_config_file

    return from_diffusers_config(read_config_file(path), source=str(path))


# diffusers transformer classes -> how their config keys map onto the spec.
DIFFUSERS_CLASSES: dict[str, str] = {
    "FluxTransformer2DModel": "mmdit",
    "SD3Transformer2DModel": "mmdit",
    "HunyuanVideoTransformer3DModel": "mmdit",
    "WanTransformer3DModel": "cross",
    "PixArtTransformer2DModel": "cross",
    "CogVideoXTransformer3DModel": "cogvideo",
    "MochiTransformer3DModel": "asym",
    "EasyAnimateTransformer3DModel": "mmdit",
    "ZImageTransformer2DModel": "single",
    "StableAudioDiTModel": "cross",
    "QwenImageTransformer2DModel": "mmdit",
    "SanaTransformer2DModel": "cross",
    "Lumina2Transformer2DModel": "single",
    "Flux2Transformer2DModel": "mmdit",
    "LTXVideoTransformer3DModel": "cross",
    # Wan 2.1's blocks and embedders under other names: SkyReels-V2 (+ an optional fps embedding)
    # and ChronoEdit (Wan 2.1 I2V with a temporal-skip RoPE, no parameters of its own)
    "SkyReelsV2Transformer3DModel": "cross",
    "ChronoEditTransformer3DModel": "cross",
}
_WAN_LIKE = ("WanTransformer3DModel", "SkyReelsV2Transformer3DModel", "ChronoEditTransformer3DModel")


def _need(cfg: dict[str, Any], key: str, cls: str, where: str) -> Any:
    if key not in cfg:
        raise ModelConfigError(
            f"{where}: {cls} config is missing key {key!r}",
            "pass the transformer's own config.json (the transformer/ folder of a diffusers checkpoint)",
        )
    v = cfg[key]
    if key in _FLOAT_KEYS:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 64:
            raise ModelConfigError(
                f"{where}: {cls} key {key!r} must be a number in (0, 64], got {echo(v)}",
                f"fix {key} in the config",
            )
        return v
    items = v if isinstance(v, list) else [v]
    cap = MAX_DIT_LAYERS if "layers" in key else MAX_DIT_WIDTH
    for x in items:
        if (
            isinstance(x, bool)
            or not isinstance(x, int)
            or not 1 <= x <= cap
            or (isinstance(v, list) and len(v) > 3)
        ):
            raise ModelConfigError(
                f"{where}: {cls} key {key!r} must be a whole number from 1 to {cap:,}, got {echo(v)}",
                f"fix {key} in the config",
            )
    return v


_FLOAT_KEYS = ("mlp_ratio",)


def _dual_attention_layers(cfg: dict[str, Any], layers: int, where: str) -> int:
    """How many SD3 blocks carry the MMDiT-X second attention (``dual_attention_layers``: block indices)."""
    v = cfg.get("dual_attention_layers") or []
    if not isinstance(v, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
        raise ModelConfigError(
            f"{where}: dual_attention_layers must be a list of block indices, got {echo(v)}",
            "fix dual_attention_layers in the config",
        )
    if len(set(v)) != len(v) or any(not 0 <= i < layers for i in v):
        raise ModelConfigError(
            f"{where}: dual_attention_layers must list distinct blocks from 0 to {layers - 1}, got {echo(v)}",
            "fix dual_attention_layers in the config",
        )
    return len(v)


def from_diffusers_config(cfg: dict[str, Any], *, source: str = "(dict)") -> DiTSpec:
    """Normalize a diffusers transformer ``config.json``; its ``_class_name`` picks the block kind.

    The VAE and text encoders are not in the transformer's config: they are taken from the preset of
    the same family (its VAE strides are what the class implies), and said so in ``source``.
    """
    spec = _from_diffusers(cfg, source)
    for what, v in (("hidden width", spec.hidden), ("attention width (heads x head dim)", spec.inner)):
        if v > MAX_DIT_WIDTH:
            raise ModelConfigError(
                f"{source}: the {what} is {v:,}, over the limit of {MAX_DIT_WIDTH:,}",
                "fix attention_head_dim / num_attention_heads in the config",
            )
    return spec


def _from_diffusers(cfg: dict[str, Any], source: str) -> DiTSpec:
    cls = cfg.get("_class_name")
    if not isinstance(cls, str):
        raise ModelConfigError(
            f"{source}: no '_class_name' (not a diffusers transformer config)",
            f"pass a transformer config.json of one of: {', '.join(DIFFUSERS_CLASSES)}",
        )
    if cls not in DIFFUSERS_CLASSES and cls.startswith("UNet"):
        raise UnsupportedArchitecture(
            f"{source}: diffusers class {cls!r} is not modelled: it is a UNet (convolutional down/up "
            "blocks with attention inside), not a diffusion transformer, and autopar dit costs transformer blocks",
            f"pass a transformer config of one of: {', '.join(DIFFUSERS_CLASSES)}",
        )
    if cls not in DIFFUSERS_CLASSES:
        raise UnsupportedArchitecture(
            f"{source}: diffusers class {cls!r} is not modelled",
            f"supported: {', '.join(DIFFUSERS_CLASSES)}",
        )

    def need(k: str) -> Any:
        return _need(cfg, k, cls, source)

    name = str(cfg.get("_name_or_path") or Path(source).parent.name or cls)
    common: dict[str, Any] = {"published_params": 0.0, "published_source": "", "defaults": {}}
    if cls == "EasyAnimateTransformer3DModel":
        return _easyanimate(cfg, need, name, source, common)
    if cls == "ZImageTransformer2DModel":
        return _zimage(cfg, need, name, source, common)
    if cls == "StableAudioDiTModel":
        return _stable_audio(cfg, need, name, source, common)
    if cls == "QwenImageTransformer2DModel":
        return _qwen_image(cfg, need, name, source, common)
    if cls == "SanaTransformer2DModel":
        return _sana(cfg, need, name, source, common)
    if cls == "Lumina2Transformer2DModel":
        return _lumina2(cfg, need, name, source, common)
    if cls == "Flux2Transformer2DModel":
        return _flux2(cfg, need, name, source, common)
    if cls == "LTXVideoTransformer3DModel":
        return _ltx_video(cfg, need, name, source, common)
    if cls == "FluxTransformer2DModel":
        hd, H = need("attention_head_dim"), need("num_attention_heads")
        d = hd * H
        base = _build("flux.1-dev", _data()["models"]["flux.1-dev"])
        return _replace(
            base, id=name, name=name, hidden=d, heads=H, head_dim=hd, ffn=4 * d,
            layers=need("num_layers"), single_layers=need("num_single_layers"),
            in_channels=need("in_channels") // 4, text_dim=need("joint_attention_dim"),
            pooled_dim=need("pooled_projection_dim"), guidance_embed=bool(cfg.get("guidance_embeds", False)),
            source=f"{source} (VAE and text encoders of the FLUX preset)", **common,
        )  # fmt: skip
    if cls == "SD3Transformer2DModel":
        hd, H = need("attention_head_dim"), need("num_attention_heads")
        d = hd * H
        base = _build("sd3.5-large", _data()["models"]["sd3.5-large"])
        p, L = need("patch_size"), need("num_layers")
        pos = need("pos_embed_max_size") ** 2 if cfg.get("pos_embed_max_size") is not None else 0
        return _replace(
            base, id=name, name=name, hidden=d, heads=H, head_dim=hd, ffn=4 * d, layers=L,
            patch=(1, p, p), in_channels=need("in_channels"), text_dim=need("joint_attention_dim"),
            pooled_dim=need("pooled_projection_dim"), pos_embed_tokens=pos,
            dual_attention_layers=_dual_attention_layers(cfg, L, source),
            source=f"{source} (VAE and text encoders of the SD3.5 preset)", **common,
        )  # fmt: skip
    if cls == "HunyuanVideoTransformer3DModel":
        hd, H = need("attention_head_dim"), need("num_attention_heads")
        d = hd * H
        base = _build("hunyuanvideo", _data()["models"]["hunyuanvideo"])
        return _replace(
            base, id=name, name=name, hidden=d, heads=H, head_dim=hd, ffn=int(d * need("mlp_ratio")),
            layers=need("num_layers"), single_layers=need("num_single_layers"),
            patch=(need("patch_size_t"), need("patch_size"), need("patch_size")),
            in_channels=need("in_channels"), text_dim=need("text_embed_dim"),
            pooled_dim=need("pooled_projection_dim"), refiner_layers=need("num_refiner_layers"),
            source=f"{source} (VAE and text encoders of the HunyuanVideo preset)", **common,
        )  # fmt: skip
    if cls in _WAN_LIKE:
        hd, H = need("attention_head_dim"), need("num_attention_heads")
        base = _build("wan2.1-t2v-14b", _data()["models"]["wan2.1-t2v-14b"])
        pt, ph, pw = need("patch_size")
        # I2V / FLF2V: image_dim (CLIP ViT-H/14 features) and added_kv_proj_dim; 257 image tokens
        # (CLIP's 16 x 16 patches + class token at 224 px), 514 for FLF2V's two frames (pos_embed_seq_len)
        image_dim = int(cfg.get("image_dim") or 0)
        added = int(cfg.get("added_kv_proj_dim") or 0)
        if bool(image_dim) != bool(added):
            raise ModelConfigError(
                f"{source}: {cls} needs image_dim and added_kv_proj_dim together",
                "set both (image-to-video) or neither (text-to-video)",
            )
        if cfg.get("pos_embed_seq_len") is not None:
            image_tokens = _need(cfg, "pos_embed_seq_len", cls, source)
            raise UnsupportedArchitecture(
                f"{source}: pos_embed_seq_len {image_tokens} (FLF2V learned image-token positions) is not modelled",
                "remove it only if the model has no first-last-frame position embedding",
            )
        spec = _replace(
            base, id=name, name=name, hidden=hd * H, heads=H, head_dim=hd, ffn=need("ffn_dim"),
            layers=need("num_layers"), patch=(pt, ph, pw), in_channels=need("in_channels"),
            text_dim=need("text_dim"), image_dim=image_dim, added_kv_dim=added,
            image_tokens=257 if image_dim else 0,
            source=f"{source} (VAE and umT5 of the Wan 2.1 preset)", **common,
        )  # fmt: skip
        if cls == "SkyReelsV2Transformer3DModel" and _flag(cfg, "inject_sample_info", False, cls, source):
            d = (
                spec.hidden
            )  # fps_embedding (2 x dim) + fps_projection: Linear(dim, dim) + SiLU + Linear(dim, 6 dim)
            spec = _replace(
                spec, embed_params=spec.embedding_params() + 2 * d + d * d + d + d * 6 * d + 6 * d
            )
        return spec
    if cls == "PixArtTransformer2DModel":
        hd, H = need("attention_head_dim"), need("num_attention_heads")
        base = _build("pixart-alpha", _data()["models"]["pixart-alpha"])
        p = need("patch_size")
        return _replace(
            base, id=name, name=name, hidden=hd * H, heads=H, head_dim=hd, ffn=4 * hd * H,
            layers=need("num_layers"), patch=(1, p, p), in_channels=need("in_channels"),
            text_dim=need("caption_channels"), source=f"{source} (VAE and T5 of the PixArt preset)", **common,
        )  # fmt: skip
    if cls == "CogVideoXTransformer3DModel":
        hd, H = need("attention_head_dim"), need("num_attention_heads")
        base = _build("cogvideox-5b", _data()["models"]["cogvideox-5b"])
        p = need("patch_size")
        return _replace(
            base, id=name, name=name, hidden=hd * H, heads=H, head_dim=hd, ffn=4 * hd * H,
            layers=need("num_layers"), patch=(int(cfg.get("patch_size_t") or 1), p, p),
            in_channels=need("in_channels"), text_dim=need("text_embed_dim"),
            cond_dim=need("time_embed_dim"), text_tokens=need("max_text_seq_length"),
            source=f"{source} (VAE and T5 of the CogVideoX preset)", **common,
        )  # fmt: skip
    # MochiTransformer3DModel
    hd, H = need("attention_head_dim"), need("num_attention_heads")
    base = _build("mochi-1", _data()["models"]["mochi-1"])
    p = need("patch_size")
    return _replace(
        base, id=name, name=name, hidden=hd * H, heads=H, head_dim=hd, layers=need("num_layers"),
        patch=(1, p, p), in_channels=need("in_channels"), text_dim=need("text_embed_dim"),
        text_hidden=need("pooled_projection_dim"), source=f"{source} (VAE and T5 of the Mochi preset)",
        **common,
    )  # fmt: skip


def _flag(cfg: dict[str, Any], key: str, default: bool, cls: str, where: str) -> bool:
    v = cfg.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ModelConfigError(
            f"{where}: {cls} key {key!r} must be true or false, got {echo(v)}", f"fix {key}"
        )
    return v


def _easyanimate(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers EasyAnimateTransformer3DModel (EasyAnimate V5/V5.1): MMDiT blocks, each with image
    and text weights of its own (attn1 to_q/k/v/out + add_q/k/v_proj/to_add_out, ff + txt_ff, GELU)
    over one joint attention, two EasyAnimateLayerNormZero modulations (time_embed_dim -> 6 x inner)
    per block; a Conv2d patch embedding of 1 x p x p, the timestep MLP from inner-wide sinusoids."""
    cls = "EasyAnimateTransformer3DModel"
    hd, H = need("attention_head_dim"), need("num_attention_heads")
    d, L, p = hd * H, need("num_layers"), need("patch_size")
    mm = need("mmdit_layers")
    if mm < L:
        raise UnsupportedArchitecture(
            f"{source}: {cls} with mmdit_layers {mm} < num_layers {L} (blocks whose text shares the image "
            "weights after the MMDiT ones) is not modelled",
            "only configs whose every block is an MMDiT block (mmdit_layers >= num_layers) are read",
        )
    if cfg.get("text_embed_dim_t5") is not None:
        raise UnsupportedArchitecture(
            f"{source}: {cls} with text_embed_dim_t5 (a second, T5 caption stream) is not modelled",
            "only the single-encoder (Qwen2-VL) configs of EasyAnimate V5.1 are read",
        )
    act = cfg.get("activation_fn", "gelu-approximate")
    if act not in ("gelu", "gelu-approximate"):
        raise UnsupportedArchitecture(
            f"{source}: {cls} activation_fn {echo(act)} is not modelled", "the GELU FeedForward is read"
        )
    c, C_in, C_out, tdim = (
        need("time_embed_dim"),
        need("in_channels"),
        need("out_channels"),
        need("text_embed_dim"),
    )
    affine = _flag(cfg, "norm_elementwise_affine", True, cls, source)
    add_norm = _flag(cfg, "add_norm_text_encoder", False, cls, source)
    after = _flag(cfg, "after_norm", False, cls, source)
    a2 = 2 if affine else 0  # LayerNorm weight + bias
    embed = (
        d * c + c + c * c + c  # time_embedding: TimestepEmbedding(inner -> time_embed_dim)
        + C_in * p * p * d + d  # proj: Conv2d(in_channels, inner, p x p)
        + (tdim if add_norm else 0) + tdim * d + d  # text_proj: (RMSNorm) + Linear
        + a2 * d  # norm_final
        + c * 2 * d + 2 * d + a2 * d  # norm_out: AdaLayerNorm linear (time_embed_dim -> 2 x inner) + LayerNorm
        + d * p * p * C_out + p * p * C_out  # proj_out
    )  # fmt: skip
    # per block: norm1/norm2 LayerNorms (affine), q/k and added q/k LayerNorms (head_dim, affine)
    norms = L * (2 * a2 * d + 4 * a2 * hd) + (a2 * d if after else 0)
    return DiTSpec(
        id=name, name=name, arch="mmdit", hidden=d, heads=H, head_dim=hd, ffn=4 * d, layers=L,
        single_layers=0, patch=(1, p, p), in_channels=C_in, text_dim=tdim, text_tokens=256,
        vae=_vae("magvit-vae"), text_encoders=(_encoder("qwen2-vl-7b-text", 256),), cfg=True,
        cond_dim=c, embed_params=embed, norm_count=norms,
        source=f"{source} (EasyAnimate's Magvit VAE and Qwen2-VL text encoder, 256 caption tokens: "
        "diffusers EasyAnimatePipeline max_sequence_length; CFG: its guidance_scale 5.0)",
        **common,
    )  # fmt: skip


def _zimage(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers ZImageTransformer2DModel (Z-Image, S3-DiT): ``n_layers`` single-stream blocks over the
    image and caption tokens with shared weights (to_q/k/v/out without bias, RMSNorm q/k, a SwiGLU
    FFN of int(dim / 3 x 8), four RMSNorms, a 4-way adaLN from a min(dim, 256)-wide conditioning
    vector), after ``n_refiner_layers`` noise-refiner blocks on the image tokens (modulated) and as
    many context-refiner blocks on the caption tokens (not modulated). ``n_kv_heads`` is not used
    by the class (every attention has ``n_heads`` key/value heads)."""
    cls = "ZImageTransformer2DModel"
    if cfg.get("siglip_feat_dim") is not None:
        raise UnsupportedArchitecture(
            f"{source}: {cls} with siglip_feat_dim (Z-Image Omni's SigLIP image branch) is not modelled",
            "only the text-to-image configs (no siglip_feat_dim) are read",
        )
    ps, fs = need("all_patch_size"), need("all_f_patch_size")
    ps, fs = (ps if isinstance(ps, list) else [ps]), (fs if isinstance(fs, list) else [fs])
    if len(ps) != 1 or len(fs) != 1:
        raise UnsupportedArchitecture(
            f"{source}: {cls} with several patch sizes (all_patch_size {echo(ps)}) is not modelled",
            "only configs with one patch size are read",
        )
    d, H, L, R = need("dim"), need("n_heads"), need("n_layers"), need("n_refiner_layers")
    if d % H:
        raise ModelConfigError(
            f"{source}: {cls} dim {d} is not a multiple of n_heads {H}", "fix dim or n_heads"
        )
    p, pf, C, cap = ps[0], fs[0], need("in_channels"), need("cap_feat_dim")
    qk = _flag(cfg, "qk_norm", True, cls, source)
    c = min(d, 256)  # ADALN_EMBED_DIM
    patch = pf * p * p * C
    embed = (
        patch * d + d  # x_embedder
        + c * d + d + d * patch + patch  # final layer: adaLN Linear(256 -> dim), Linear(dim -> patch)
        + 256 * 1024 + 1024 + 1024 * c + c  # t_embedder: 256 sinusoids -> 1024 -> min(dim, 256)
        + cap + cap * d + d  # cap_embedder: RMSNorm + Linear
        + 2 * d  # x_pad_token, cap_pad_token
    )  # fmt: skip
    hd = d // H
    return DiTSpec(
        id=name, name=name, arch="single", hidden=d, heads=H, head_dim=hd, ffn=int(d / 3 * 8), layers=L,
        single_layers=0, patch=(pf, p, p), in_channels=C, text_dim=cap, text_tokens=512,
        vae=_vae("flux-ae"), text_encoders=(_encoder("qwen3-4b", 512),), cfg=True, ffn_kind="swiglu",
        cond_dim=c, img_refiner_layers=R, txt_refiner_layers=R, linear_bias=False, ffn_bias=False,
        embed_params=embed,
        norm_count=(L + 2 * R) * (4 * d + (2 * hd if qk else 0)),
        source=f"{source} (the FLUX VAE and Qwen3-4B text encoder of Z-Image, 512 caption tokens: diffusers "
        "ZImagePipeline max_sequence_length; CFG: its guidance_scale 5.0, pass --no-cfg for Z-Image-Turbo)",
        **common,
    )  # fmt: skip


def _stable_audio(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers StableAudioDiTModel (Stable Audio Open): ``num_layers`` StableAudioDiTBlocks, each
    LayerNorm -> self-attention (to_q/k/v/out, no bias) -> LayerNorm -> cross-attention to the
    caption (query from the audio, key/value from cross_attention_dim features into
    num_key_value_attention_heads heads, no bias) -> LayerNorm -> SwiGLU FeedForward of 4 x inner
    (with bias); no adaLN: the timestep and the seconds conditioning enter as one global token
    prepended to the sequence. Every forward denoises the config's sample_size latents."""
    hd, H, kvH = (
        need("attention_head_dim"),
        need("num_attention_heads"),
        need("num_key_value_attention_heads"),
    )
    d, L = hd * H, need("num_layers")
    if H % kvH:
        raise ModelConfigError(
            f"{source}: StableAudioDiTModel num_attention_heads {H} is not a multiple of "
            f"num_key_value_attention_heads {kvH}",
            "fix the head counts",
        )
    C_in, C_out = need("in_channels"), need("out_channels")
    xdim, xin, gin, tproj = (
        need("cross_attention_dim"),
        need("cross_attention_input_dim"),
        need("global_states_input_dim"),
        need("time_proj_dim"),
    )
    window = cfg.get("sample_size", 1024)
    if isinstance(window, float) and window.is_integer():
        window = int(window)  # published configs write 1024.0
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_DIT_WIDTH:
        raise ModelConfigError(
            f"{source}: StableAudioDiTModel key 'sample_size' must be a whole number from 1 to "
            f"{MAX_DIT_WIDTH:,}, got {echo(window)}",
            "fix sample_size in the config",
        )
    embed = (
        tproj // 2  # time_proj: the Gaussian Fourier weight (a parameter, not trained)
        + tproj * d + d + d * d + d  # timestep_proj
        + gin * d + d * d  # global_proj (no bias)
        + xin * xdim + xdim * xdim  # cross_attention_proj (no bias)
        + C_in * C_in + C_in * d  # preprocess_conv (1x1), proj_in
        + d * C_out + C_out * C_out  # proj_out, postprocess_conv (1x1)
    )  # fmt: skip
    return DiTSpec(
        id=name, name=name, arch="cross", hidden=d, heads=H, head_dim=hd, ffn=4 * d, layers=L,
        single_layers=0, patch=(1, 1, 1), in_channels=C_in, text_dim=xin, text_tokens=130,
        vae=_vae("oobleck-vae"), text_encoders=(_encoder("t5-base-encoder", 128),), cfg=True,
        ffn_kind="swiglu", linear_bias=False, cross_kv_dim=xdim, cross_kv_heads=kvH, adaln=False,
        audio_latents=window, prefix_tokens=1, embed_params=embed, norm_count=L * 3 * 2 * d,
        source=f"{source} (Stable Audio Open's Oobleck VAE and T5-base encoder; 130 caption tokens: the "
        "tokenizer's model_max_length 128 + the seconds_start / seconds_end tokens of StableAudioPipeline; "
        "CFG: its guidance_scale 7.0)",
        **common,
    )  # fmt: skip


def _qwen_image(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers QwenImageTransformer2DModel (Qwen-Image, MMDiT): ``num_layers`` double-stream blocks,
    each with image and text weights of its own (attn to_q/k/v/out + add_q/k/v_proj/to_add_out,
    img_mlp + txt_mlp GELU FeedForwards of 4 x inner, RMSNorm q/k and added q/k) over one joint
    attention, and img_mod / txt_mod (inner -> 6 x inner) modulations; no single-stream blocks.
    ``in_channels`` is the packed 2x2 patch (64 = 16 latent channels x 4)."""
    cls = "QwenImageTransformer2DModel"
    if _flag(cfg, "use_additional_t_cond", False, cls, source):
        raise UnsupportedArchitecture(
            f"{source}: {cls} with use_additional_t_cond (an extra timestep condition) is not modelled",
            "only configs without use_additional_t_cond are read",
        )
    hd, H, L, p = (
        need("attention_head_dim"),
        need("num_attention_heads"),
        need("num_layers"),
        need("patch_size"),
    )
    d, C_in, jad = hd * H, need("in_channels"), need("joint_attention_dim")
    C_out = cfg.get("out_channels") or 16
    if C_in % (p * p):
        raise ModelConfigError(
            f"{source}: {cls} in_channels {C_in} is not a multiple of patch_size^2 = {p * p}",
            "fix in_channels (the packed latent channels) or patch_size",
        )
    embed = (
        256 * d + d + d * d + d  # time_text_embed: TimestepEmbedding(256 -> inner)
        + jad + jad * d + d  # txt_norm (RMSNorm) + txt_in
        + C_in * d + d  # img_in (the packed patch)
        + d * 2 * d + 2 * d  # norm_out: AdaLayerNormContinuous linear (inner -> 2 x inner)
        + d * p * p * C_out + p * p * C_out  # proj_out
    )  # fmt: skip
    return DiTSpec(
        id=name, name=name, arch="mmdit", hidden=d, heads=H, head_dim=hd, ffn=4 * d, layers=L,
        single_layers=0, patch=(1, p, p), in_channels=C_in // (p * p), text_dim=jad, text_tokens=512,
        vae=_vae("qwen-image-vae"), text_encoders=(_encoder("qwen2.5-vl-7b-text", 512),), cfg=True,
        cond_dim=d, embed_params=embed,
        source=f"{source} (Qwen-Image's VAE and Qwen2.5-VL text encoder, 512 caption tokens: diffusers "
        "QwenImagePipeline max_sequence_length; CFG: its true_cfg_scale 4.0 with a negative prompt)",
        **common,
    )  # fmt: skip


def _sana(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers SanaTransformer2DModel (SANA, SANA-Sprint with guidance_embeds): the SANA preset's
    blocks (ReLU linear self-attention, cross-attention to the Gemma caption, GLUMBConv FFN of
    int(mlp_ratio x inner), adaLN-single tables) at the config's sizes. The cross-attention's
    num_cross_attention_heads x cross_attention_head_dim must be the hidden width (as in every
    published SANA): the blocks are costed at one attention width."""
    cls = "SanaTransformer2DModel"
    hd, H, p = need("attention_head_dim"), need("num_attention_heads"), need("patch_size")
    d = hd * H
    cross = cfg.get("cross_attention_dim")
    if cross is None:
        raise UnsupportedArchitecture(
            f"{source}: {cls} without cross_attention_dim (no caption cross-attention) is not modelled",
            "only text-conditioned SANA configs are read",
        )
    xw = need("num_cross_attention_heads") * need("cross_attention_head_dim")
    if xw != d or need("cross_attention_dim") != d:
        raise UnsupportedArchitecture(
            f"{source}: {cls} cross-attention width {xw} (keys from {cross}) differs from the hidden width {d}: "
            "not modelled",
            "only configs whose cross-attention is as wide as the blocks are read",
        )
    base = _build("sana-1600m", _data()["models"]["sana-1600m"])
    return _replace(
        base, id=name, name=name, hidden=d, heads=H, head_dim=hd, ffn=int(need("mlp_ratio") * d),
        layers=need("num_layers"), patch=(1, p, p), in_channels=need("in_channels"),
        text_dim=need("caption_channels"), guidance_embed=_flag(cfg, "guidance_embeds", False, cls, source),
        source=f"{source} (DC-AE and Gemma-2 of the SANA preset)", **common,
    )  # fmt: skip


def _lumina2(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers Lumina2Transformer2DModel (Lumina-Image 2.0): Z-Image's layout (``single``) with
    grouped-query attention (num_kv_heads), a LuminaFeedForward SwiGLU of 4 x hidden (x
    ffn_dim_multiplier, rounded up to multiple_of) and a min(hidden, 1024)-wide conditioning
    vector; num_refiner_layers noise-refiner (modulated) and context-refiner blocks."""
    cls = "Lumina2Transformer2DModel"
    d, H, kvH = need("hidden_size"), need("num_attention_heads"), need("num_kv_heads")
    L, R, p, C, cap = (
        need("num_layers"),
        need("num_refiner_layers"),
        need("patch_size"),
        need("in_channels"),
        need("cap_feat_dim"),
    )
    if d % H or H % kvH:
        raise ModelConfigError(
            f"{source}: {cls} hidden_size {d}, num_attention_heads {H} and num_kv_heads {kvH} do not divide",
            "fix the head counts",
        )
    mult, m = cfg.get("ffn_dim_multiplier"), need("multiple_of")
    f = 4 * d
    if mult is not None:
        if isinstance(mult, bool) or not isinstance(mult, int | float) or not 0 < mult <= 64:
            raise ModelConfigError(
                f"{source}: {cls} key 'ffn_dim_multiplier' must be a number in (0, 64], got {echo(mult)}",
                "fix ffn_dim_multiplier in the config",
            )
        f = int(mult * f)
    f = m * ((f + m - 1) // m)
    C_out = cfg.get("out_channels") or C
    c, hd = min(d, 1024), d // H
    embed = (
        p * p * C * d + d  # x_embedder
        + 256 * c + c + c * c + c  # timestep_embedder: 256 sinusoids -> min(hidden, 1024)
        + cap + cap * d + d  # caption_embedder: RMSNorm + Linear
        + c * d + d + d * p * p * C_out + p * p * C_out  # norm_out: linear_1 (cond -> hidden), linear_2
    )  # fmt: skip
    return DiTSpec(
        id=name, name=name, arch="single", hidden=d, heads=H, head_dim=hd, ffn=f, layers=L,
        single_layers=0, patch=(1, p, p), in_channels=C, text_dim=cap, text_tokens=256,
        vae=_vae("flux-ae"), text_encoders=(_encoder("gemma-2-2b", 256),), cfg=True, ffn_kind="swiglu",
        cond_dim=c, img_refiner_layers=R, txt_refiner_layers=R, kv_heads=kvH, linear_bias=False,
        ffn_bias=False, embed_params=embed, norm_count=(L + 2 * R) * (4 * d + 2 * hd),
        source=f"{source} (Lumina-Image 2.0's FLUX VAE and Gemma-2-2B, 256 caption tokens: diffusers "
        "Lumina2Pipeline max_sequence_length; CFG: its guidance_scale 4.0)",
        **common,
    )  # fmt: skip


# FLUX.2's text encoder, known by the width of its stacked hidden states (3 layers): [dev] Mistral
# Small 3.x 24B, [klein] 4B Qwen3-4B and 9B Qwen3-8B
_FLUX2_TEXT = {15360: "mistral-small-3.1-24b-text", 7680: "qwen3-4b", 12288: "qwen3-8b"}


def _flux2(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers Flux2Transformer2DModel (FLUX.2 [dev] / [klein]): ``num_layers`` double-stream blocks
    (image and text weights, SwiGLU FFN of mlp_ratio x inner fused in linear_in) and
    ``num_single_layers`` parallel single-stream blocks (to_qkv_mlp_proj: 3 x inner + 2 x FFN, to_out:
    inner + FFN), no biases anywhere, RMSNorm q/k; three modulations shared by all blocks (image and
    text streams 6-way, single stream 3-way) from the hidden-wide time (+ guidance) embedding. The
    pipeline packs 2x2 latents of its 32-channel VAE into the 128 in_channels (patch_size 1)."""
    cls = "Flux2Transformer2DModel"
    hd, H = need("attention_head_dim"), need("num_attention_heads")
    L, S = need("num_layers"), need("num_single_layers")
    d, C_in, jad, p = hd * H, need("in_channels"), need("joint_attention_dim"), need("patch_size")
    if p != 1 or C_in % 4:
        raise UnsupportedArchitecture(
            f"{source}: {cls} with patch_size {p} and in_channels {C_in} is not modelled",
            "FLUX.2's configs have patch_size 1 over 2x2-packed latents (in_channels a multiple of 4)",
        )
    if jad not in _FLUX2_TEXT:
        raise UnsupportedArchitecture(
            f"{source}: {cls} joint_attention_dim {jad} names no text encoder autopar knows",
            f"known: {', '.join(f'{k} ({v})' for k, v in _FLUX2_TEXT.items())}",
        )
    f, tg = int(d * need("mlp_ratio")), need("timestep_guidance_channels")
    guidance = _flag(cfg, "guidance_embeds", True, cls, source)
    C_out = cfg.get("out_channels") or C_in
    embed = (
        (2 if guidance else 1) * (tg * d + d * d)  # timestep (+ guidance) TimestepEmbedding, no bias
        + C_in * d
        + jad * d  # x_embedder, context_embedder
        + d * 2 * d
        + d * C_out  # norm_out linear (inner -> 2 x inner), proj_out
    )
    te = _FLUX2_TEXT[jad]
    return DiTSpec(
        id=name, name=name, arch="mmdit", hidden=d, heads=H, head_dim=hd, ffn=f, layers=L, single_layers=S,
        patch=(1, 2, 2), in_channels=C_in // 4, text_dim=jad, text_tokens=512, vae=_vae("flux2-vae"),
        text_encoders=(_encoder(te, 512),), cfg=not guidance, ffn_kind="swiglu", cond_dim=d,
        guidance_embed=guidance, linear_bias=False, ffn_bias=False, shared_modulation=True,
        embed_params=embed, norm_count=L * 4 * hd + S * 2 * hd,
        source=f"{source} (FLUX.2's 32-channel VAE and the {te} text encoder its joint_attention_dim implies, "
        "512 caption tokens: diffusers Flux2Pipeline max_sequence_length; "
        + ("guidance-distilled: no CFG pass)" if guidance else "CFG on: pass --no-cfg for a step-distilled klein)"),
        **common,
    )  # fmt: skip


def _ltx_video(cfg: dict[str, Any], need: Any, name: str, source: str, common: dict[str, Any]) -> DiTSpec:
    """diffusers LTXVideoTransformer3DModel (LTX-Video): PixArt's ``cross`` blocks over the video
    latents (self-attention, cross-attention to the T5 caption, GELU FeedForward of 4 x inner,
    RMSNorm q/k across heads, a 6 x inner scale_shift_table per block, AdaLayerNormSingle); the
    latents enter through a Linear (patch 1 x 1 x 1: the VAE compresses 32x space, 8x time)."""
    cls = "LTXVideoTransformer3DModel"
    hd, H, L = need("attention_head_dim"), need("num_attention_heads"), need("num_layers")
    d, C_in, cap, xdim = hd * H, need("in_channels"), need("caption_channels"), need("cross_attention_dim")
    if (cfg.get("patch_size", 1), cfg.get("patch_size_t", 1)) != (1, 1):
        raise UnsupportedArchitecture(
            f"{source}: {cls} with patch_size {echo(cfg.get('patch_size'))} / patch_size_t "
            f"{echo(cfg.get('patch_size_t'))} is not modelled",
            "LTX-Video's configs have patch_size 1 and patch_size_t 1",
        )
    act = cfg.get("activation_fn", "gelu-approximate")
    qk = cfg.get("qk_norm", "rms_norm_across_heads")
    if act not in ("gelu", "gelu-approximate") or qk not in (None, "rms_norm_across_heads"):
        raise UnsupportedArchitecture(
            f"{source}: {cls} activation_fn {echo(act)} / qk_norm {echo(qk)} is not modelled",
            "the GELU FeedForward and rms_norm_across_heads (or no) q/k norm are read",
        )
    b = _flag(cfg, "attention_bias", True, cls, source)
    C_out = cfg.get("out_channels") or C_in
    embed = (
        C_in * d + d  # proj_in
        + 256 * d + d + d * d + d + d * 6 * d + 6 * d  # time_embed: AdaLayerNormSingle (timestep MLP + 6-way linear)
        + cap * d + d + d * d + d  # caption_projection: PixArtAlphaTextProjection
        + 2 * d + d * C_out + C_out  # scale_shift_table, proj_out
    )  # fmt: skip
    return DiTSpec(
        id=name, name=name, arch="cross", hidden=d, heads=H, head_dim=hd, ffn=4 * d, layers=L, single_layers=0,
        patch=(1, 1, 1), in_channels=C_in, text_dim=cap, text_tokens=128, vae=_vae("ltx-vae"),
        text_encoders=(_encoder("t5-v1.1-xxl-encoder", 128),), cfg=True, cross_kv_dim=xdim, linear_bias=b,
        embed_params=embed, norm_count=L * 4 * d if qk else 0,
        source=f"{source} (LTX-Video's VAE and T5-XXL, 128 caption tokens: diffusers LTXPipeline "
        "max_sequence_length; CFG: its guidance_scale 3)",
        **common,
    )  # fmt: skip


def _replace(spec: DiTSpec, **kw: Any) -> DiTSpec:
    from dataclasses import replace

    return replace(spec, **kw)


def describe(
    spec: DiTSpec, height: int | None = None, width: int | None = None, frames: int | None = None
) -> dict[str, Any]:
    """The spec as ``autopar dit model`` shows it (JSON-ready)."""
    d = spec.defaults
    h = height or d.get("height", 1024)
    w = width or d.get("width", 1024)
    f = frames or d.get("frames", 1)
    if spec.audio_latents:  # one fixed window: no request, no image VAE
        if height or width or frames:
            spec.token_grid(h, w, f)  # the one-line refusal: the request does not apply
        grid, latent = (1, 1, spec.audio_latents + spec.prefix_tokens), (1, 1, spec.audio_latents)
        request: dict[str, Any] | None = None
        vae_tflops: float | None = None
    else:
        grid, latent = spec.token_grid(h, w, f), spec.latent_shape(h, w, f)
        request, vae_tflops = {"height": h, "width": w, "frames": f}, spec.vae.decode_flops(f, h, w) / 1e12
    fl = spec.forward_flops(h, w, f)
    return {
        "id": spec.id,
        "name": spec.name,
        "arch": spec.arch,
        "hidden": spec.hidden,
        "heads": spec.heads,
        "head_dim": spec.head_dim,
        "ffn": spec.ffn,
        "layers": spec.layers,
        "single_layers": spec.single_layers,
        "refiner_blocks": spec.refiner_blocks,
        "patch": list(spec.patch),
        "params": spec.params,
        "params_breakdown": spec.params_breakdown(),
        "published_params": spec.published_params,
        "published_source": spec.published_source,
        "cfg": spec.cfg,
        "vae": {"name": spec.vae.name, "spatial": spec.vae.spatial, "temporal": spec.vae.temporal,
                "channels": spec.vae.channels, "source": spec.vae.source},
        "text_encoders": [{"name": e.name, "params": e.params, "tokens": e.tokens} for e in spec.text_encoders],
        "request": request,
        "latent_shape": list(latent),
        "token_grid": list(grid),
        "tokens_per_sample": grid[0] * grid[1] * grid[2],
        "text_tokens": spec.text_tokens,
        "forward_tflops": {k: v / 1e12 for k, v in fl.items()},
        "vae_decode_tflops": vae_tflops,
        "source": spec.source,
    }  # fmt: skip
