// Element `e` of a stored weight row `row` of type code `ty`, dequantized
// with the ggml formulas of src/quant (one rounding per operation), so
// every kernel that dequantizes gets the cpu's bits.

// Type codes (ty_code in mod.rs).
#define TY_Q4_0 0
#define TY_Q4_1 1
#define TY_Q5_0 2
#define TY_Q5_1 3
#define TY_Q8_0 4
#define TY_Q4_K 10
#define TY_Q5_K 11
#define TY_Q6_K 12
#define TY_F32 20
#define TY_F16 21
#define TY_BF16 22

// Runs CALL(T) with T the compile-time type code of the quantized type
// code `ty` (any other code runs the Q6_K case: callers pass quantized
// types only).
#define QTYPE_DISPATCH(ty, CALL)            \
    switch (ty) {                           \
        case TY_Q4_0: CALL(TY_Q4_0); break; \
        case TY_Q4_1: CALL(TY_Q4_1); break; \
        case TY_Q5_0: CALL(TY_Q5_0); break; \
        case TY_Q5_1: CALL(TY_Q5_1); break; \
        case TY_Q8_0: CALL(TY_Q8_0); break; \
        case TY_Q4_K: CALL(TY_Q4_K); break; \
        case TY_Q5_K: CALL(TY_Q5_K); break; \
        default: CALL(TY_Q6_K); break;      \
    }

// 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K superblock.
__device__ __forceinline__ void k_scale_min(int j, const u8* s, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// constexpr: also sizes compile-time arrays in the tile kernel.
__device__ constexpr int gr_type_size(int ty) {
    switch (ty) {
        case 0: return 18;   // Q4_0
        case 1: return 20;   // Q4_1
        case 2: return 22;   // Q5_0
        case 3: return 24;   // Q5_1
        case 4: return 34;   // Q8_0
        case 10: return 144; // Q4_K
        case 11: return 176; // Q5_K
        default: return 210; // Q6_K
    }
}

// Shared row stride of a chunk's raw weights in the int8 MMA kernels
// (matmul_mma_fast.cu, matmul_exact_mma.cu; ops/matmul/mq.rs mq_wld): 8
// blocks, padded so that the eight rows g = 0..7 of a fragment load start
// in banks 4 g apart (mod 32) or a permutation of them (Q4_1's 160 bytes
// would put rows 0 and 4 in one bank).
__device__ constexpr int mq_wld(int ty) { return ty == TY_Q4_1 ? 176 : 8 * gr_type_size(ty); }

__device__ float q_dequant(const u8* __restrict__ row, int e, int ty) {
    float y;
    if (ty == 20) {
        y = ((const float*)row)[e];
    } else if (ty == 21) {
        y = q_f16(((const u16*)row)[e]);
    } else if (ty == 22) {
        y = q_bf16(((const u16*)row)[e]);
    } else if (ty <= 4) {
        const u8* blk = row + (long long)(e / 32) * gr_type_size(ty);
        int j = e % 32, jj = j & 15, up = j >= 16;
        float d = q_f16_at(blk);
        int v;
        if (ty == 4) {
            v = (signed char)blk[2 + j];
        } else if (ty == 0 || ty == 1) {
            u8 b = blk[(ty == 0 ? 2 : 4) + jj];
            v = up ? (b >> 4) : (b & 0xF);
            if (ty == 0) v -= 8;
        } else {
            const u8* hb = blk + (ty == 2 ? 2 : 4);
            u32 qh = (u32)hb[0] | ((u32)hb[1] << 8) | ((u32)hb[2] << 16) | ((u32)hb[3] << 24);
            u8 b = hb[4 + jj];
            u32 h = up ? ((qh >> (jj + 12)) & 0x10) : (((qh >> jj) << 4) & 0x10);
            v = (int)((up ? (b >> 4) : (b & 0xF)) | h);
            if (ty == 2) v -= 16;
        }
        y = q_mul(d, __int2float_rn(v));
        if (ty == 1 || ty == 3) y = q_add(y, q_f16_at(blk + 2));
    } else if (ty == 12) {
        const u8* blk = row + (long long)(e / 256) * 210;
        int i = e % 256, h = i / 128, c = (i % 128) / 32, l = i % 32;
        u8 a = blk[64 * h + l + (c & 1) * 32];
        u8 hb = blk[128 + 32 * h + l];
        int lo = (c < 2) ? (a & 0xF) : (a >> 4);
        int hi = (hb >> (2 * c)) & 3;
        int v = (lo | (hi << 4)) - 32;
        int g = i / 16;
        float d1 = q_mul(q_f16_at(blk + 208), (float)(int)(signed char)blk[192 + g]);
        y = q_mul(d1, __int2float_rn(v));
    } else {
        const u8* blk = row + (long long)(e / 256) * gr_type_size(ty);
        int i = e % 256, j = i / 32, c = j >> 1, hi = j & 1, l = i % 32;
        const u8* s = blk + 4;
        int sc, mn;
        if (j < 4) {
            sc = s[j] & 63;
            mn = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        int u;
        if (ty == 10) {
            u8 b = blk[16 + 32 * c + l];
            u = hi ? (b >> 4) : (b & 0xF);
        } else {
            u8 b = blk[48 + 32 * c + l];
            u = hi ? (b >> 4) : (b & 0xF);
            u |= ((blk[16 + l] >> (2 * c + hi)) & 1) << 4;
        }
        float d1 = q_mul(q_f16_at(blk), __int2float_rn(sc));
        float m1 = q_mul(q_f16_at(blk + 2), __int2float_rn(mn));
        y = q_sub(q_mul(d1, __int2float_rn(u)), m1);
    }
    return y;
}

// ---------------------------------------------------------------------------
// Register decoding of one 32-value weight unit into packed int8 words
// (shared by the int8 kernels of every mode; integer only).

// Little-endian int from two 2-byte-aligned halves.
__device__ __forceinline__ int ld_i2(const u8* p) {
    const u16* h = (const u16*)p;
    return (int)((u32)h[0] | ((u32)h[1] << 16));
}
__device__ __forceinline__ int ld_i4(const u8* p) { return *(const int*)p; }

// An L2 cache policy that marks the lines it touches evict-first.
__device__ __forceinline__ unsigned long long l2_evict_first() {
    unsigned long long p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// One aligned 4-byte global word with L2 cache policy `pol`.
__device__ __forceinline__ u32 ld_g32_pol(const u8* p, unsigned long long pol) {
    u32 v;
    asm("ld.global.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol));
    return v;
}

// The N aligned words from p rounded down to 4 bytes (p is 2-byte aligned):
// returns the bit offset of p in them (0 or 16). Byte b of the block is
// then byte b of __funnelshift_rc(v[i], v[i + 1], sh + 8 * (b - 4 * i)).
// Aligned 4-byte loads instead of 2-byte ones: a third of the load
// instructions (the decode matvec is bound by them). When p is aligned the
// last word reaches 2 bytes past a block of 4N - 2 bytes: weight buffers
// carry WEIGHT_PAD bytes of padding (CudaBackend::up_weight).
//
// POL = 1: global memory only, each load carrying the L2 cache policy
// `pol` (createpolicy; the decode matvecs' MV_L2_POL: weights read once
// per step marked evict-first, so that the L2 read-ahead's lines outlive
// them). POL = 0: plain loads (any state space).
template <int N, int POL = 0>
__device__ __forceinline__ int ld_words(const u8* p, u32* v, unsigned long long pol = 0) {
    int s = (int)((unsigned long long)p & 2);
    const u32* a = (const u32*)(p - s);
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = POL ? ld_g32_pol((const u8*)(a + i), pol) : a[i];
    return 8 * s;
}

// MV_L2_POL (tuning knob): 1: the one-row and grouped decode matvecs
// (matmul_fast.cu mv_q8*, matmul.cu mv_exact32*) load their Q4_0, Q4_1 and
// Q8_0 weights with an evict-first L2 policy (decode_unit's POL). Weights
// are read once per step, so the lines a matvec has read are the first to
// leave L2: the L2 read-ahead's lines (l2_ahead_fast.cu) and the step's
// activations, K/V and small tensors stay. 0: plain loads. Loads only: no
// result depends on it. Measured on an H100 (2026-11-27, greedy tg128 /
// tg128@d512 tok/s, 0 -> 1): fast 8B Q4_0 with the read-ahead at 16 MiB
// 412.6 / 384.1 -> 431.2 / 401.5, read-ahead off 382.4 / 379.4 -> 398.0 /
// 388.3; 1B Q4_0 (8 MiB) 1,566 / 1,490 -> 1,571 / 1,511; 1B Q4_1 1,558 /
// 1,490 -> 1,593 / 1,539; 8B Q8_0 (read-ahead off) 269.2 / 266.7 -> 276.7
// / 273.0; exact 8B Q4_0 281.0 / 266.1 -> 293.5 / 275.9, Q8_0 225.0 /
// 215.7 -> 231.3 / 221.3. It also let the read-ahead pay on Q8_0
// (auto_ahead in ops/l2_ahead).
#ifndef MV_L2_POL
#define MV_L2_POL 1
#endif

// Bit b of each byte's position: spreads 4 bits of `t` to bit 4 of bytes 0..3.
__device__ __forceinline__ int spread4(u32 t) {
    return (int)(((t & 1u) << 4) | ((t & 2u) << 11) | ((t & 4u) << 18) | ((t & 8u) << 25));
}

__device__ __forceinline__ float f16_at2(const u8* p) { return q_f16(*(const u16*)p); }

// The integer dots of a decoded unit w[8] with its 32 int8 activations at
// xq (16-byte aligned): *i0 of values 0..15, *i1 of 16..31 (__dp4a, in
// order; integers, so any order gives the same bits). (The exact matvec's
// tiles of 32 blocks for these activations, so that a warp's 16-byte loads
// read 512 contiguous bytes, were 1-14% faster in a standalone matvec but
// 3-6% slower in the decode graphs of the 8B, 1B and SmolLM2 on an H200,
// with every writer and reader moved: docs/PERF.md, 2026-11-27 late night.)
__device__ __forceinline__ void unit_idot(const int* w, const signed char* xq, int* i0, int* i1) {
    const int4* xa = (const int4*)xq;
    int4 x0 = xa[0], x1 = xa[1];
    int s0 = __dp4a(w[0], x0.x, 0);
    s0 = __dp4a(w[1], x0.y, s0);
    s0 = __dp4a(w[2], x0.z, s0);
    s0 = __dp4a(w[3], x0.w, s0);
    int s1 = __dp4a(w[4], x1.x, 0);
    s1 = __dp4a(w[5], x1.y, s1);
    s1 = __dp4a(w[6], x1.z, s1);
    s1 = __dp4a(w[7], x1.w, s1);
    *i0 = s0;
    *i1 = s1;
}

// A Q4_0 block from its five words v (ld_words, shift sh): the values into
// w[8] as decode_unit's, unsigned (raw) or less 8; returns the scale.
__device__ __forceinline__ float q4_0_words(const u32* v, int sh, int* w, bool raw) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int q = (int)__funnelshift_rc(v[i], v[i + 1], sh + 16);
        w[i] = raw ? q & 0x0F0F0F0F : __vsub4(q & 0x0F0F0F0F, 0x08080808);
        w[i + 4] = raw ? (q >> 4) & 0x0F0F0F0F : __vsub4((q >> 4) & 0x0F0F0F0F, 0x08080808);
    }
    return q_f16((u16)__funnelshift_rc(v[0], v[1], sh));
}

// Decodes unit `u` of a weight row into w[8] (values 4i..4i+3 in word i, as
// signed int8), the scales A0 (values 0..15), A1 (16..31) and the minimum B.
// POL, pol: global weights loaded with L2 policy pol (ld_words; Q4_0, Q4_1
// and Q8_0 blocks, other types load plainly). RAW: Q4_0 and Q5_0 keep their
// stored unsigned values (0..15, 0..31) without the offset (8, 16), which
// the caller subtracts once per block from the integer dot (offset times the
// activations' integer sum: the same integer, fewer instructions; the other
// types ignore it).
template <int TY, int POL = 0, bool RAW = false>
__device__ __forceinline__ void decode_unit(const u8* __restrict__ row, int u, int* w, float& a0,
                                            float& a1, float& b, unsigned long long pol = 0) {
    b = 0.0f;
    if (TY == TY_Q4_0) {
        u32 v[5];
        int sh = ld_words<5, POL>(row + (long long)u * 18, v, pol);
        a0 = a1 = q4_0_words(v, sh, w, RAW);
    } else if (TY == TY_Q4_1) {
        const u8* blk = row + (long long)u * 20;
        if (POL) {  // d and m in one word (20-byte blocks are 4-byte aligned)
            u32 dm = ld_g32_pol(blk, pol);
            a0 = a1 = q_f16((u16)(dm & 0xFFFF));
            b = q_f16((u16)(dm >> 16));
        } else {
            a0 = a1 = f16_at2(blk);
            b = f16_at2(blk + 2);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int q = POL ? (int)ld_g32_pol(blk + 4 + 4 * i, pol) : ld_i4(blk + 4 + 4 * i);
            w[i] = q & 0x0F0F0F0F;
            w[i + 4] = (q >> 4) & 0x0F0F0F0F;
        }
    } else if (TY == TY_Q5_0 || TY == TY_Q5_1) {
        const int bs = TY == TY_Q5_0 ? 22 : 24;
        const u8* blk = row + (long long)u * bs;
        a0 = a1 = f16_at2(blk);
        const u8* hb = blk + (TY == TY_Q5_0 ? 2 : 4);
        if (TY == TY_Q5_1) b = f16_at2(blk + 2);
        u32 qh = (u32)ld_i2(hb);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int q = TY == TY_Q5_0 ? ld_i2(hb + 4 + 4 * i) : ld_i4(hb + 4 + 4 * i);
            int lo = (q & 0x0F0F0F0F) | spread4(qh >> (4 * i));
            int hi = ((q >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i));
            if (TY == TY_Q5_0 && !RAW) {
                lo = __vsub4(lo, 0x10101010);
                hi = __vsub4(hi, 0x10101010);
            }
            w[i] = lo;
            w[i + 4] = hi;
        }
    } else if (TY == TY_Q8_0) {
        const u8* blk = row + (long long)u * 34;
        u32 v[9];
        int sh = ld_words<9, POL>(blk, v, pol);
        a0 = a1 = q_f16((u16)__funnelshift_rc(v[0], v[1], sh));
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = (int)__funnelshift_rc(v[i], v[i + 1], sh + 16);
    } else if (TY == TY_Q4_K || TY == TY_Q5_K) {
        const int bs = TY == TY_Q4_K ? 144 : 176;
        const u8* blk = row + (long long)(u >> 3) * bs;
        int j = u & 7, c = j >> 1, hi = j & 1;
        int sc, mn;
        k_scale_min(j, blk + 4, &sc, &mn);
        float d = f16_at2(blk), dmin = f16_at2(blk + 2);
        a0 = a1 = d * (float)sc;
        b = -dmin * (float)mn;
        // Superblocks are 16-byte multiples and tensors 256-byte aligned.
        const int4* qs = (const int4*)(blk + (TY == TY_Q4_K ? 16 : 48) + 32 * c);
        int4 q0 = qs[0], q1 = qs[1];
        int q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = (q[i] >> (4 * hi)) & 0x0F0F0F0F;
        if (TY == TY_Q5_K) {
            const int4* qh = (const int4*)(blk + 16);
            int4 h0 = qh[0], h1 = qh[1];
            int h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] |= ((h[i] >> (2 * c + hi)) & 0x01010101) << 4;
        }
    } else {  // Q6_K: unit s = 4h + c covers values 128h + 32c + 0..31.
        const u8* blk = row + (long long)(u >> 3) * 210;
        int s = u & 7, h = s >> 2, c = s & 3;
        float d = f16_at2(blk + 208);
        a0 = d * (float)(signed char)blk[192 + 2 * s];
        a1 = d * (float)(signed char)blk[192 + 2 * s + 1];
        const u8* ql = blk + 64 * h + (c & 1) * 32;
        const u8* qh = blk + 128 + 32 * h;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int lo = (ld_i2(ql + 4 * i) >> (4 * (c >> 1))) & 0x0F0F0F0F;
            int hb = ((ld_i2(qh + 4 * i) >> (2 * c)) & 0x03030303) << 4;
            w[i] = __vsub4(lo | hb, 0x20202020);
        }
    }
}

// f16x2 arithmetic through PTX (no header).
__device__ __forceinline__ u32 h2_sub(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 h2_fma(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Bytes 0, 1 (lo) or 2, 3 (hi) of x as the f16 pair 1024 + byte: the byte
// placed in the mantissa of 1024 (one byte permute per two values; exact).
__device__ __forceinline__ u32 h2_bytes01(u32 x) { return __byte_perm(x, 0x64646464u, 0x4140); }
__device__ __forceinline__ u32 h2_bytes23(u32 x) { return __byte_perm(x, 0x64646464u, 0x4342); }

// Unit u of weight row `row` (or zeros when `valid` is false) as 32 f16
// values A * q + B in h (values 2i, 2i + 1 in h[i], the lower first), for
// the tensor-core tile kernels (matmul_f16_fast, matmul_wgmma_fast). The integer q
// is made exactly in f16 (1024 + biased byte, minus the bias), then one f16
// FMA with A and B rounded to f16 (exact for the 32-block types' f16
// scales; the K-quants' products d * sc round once more: fast mode only).
template <int TY>
__device__ __forceinline__ void unit_f16_regs(const u8* __restrict__ row, int u, bool valid,
                                              u32* h) {
    if (!valid) {
#pragma unroll
        for (int i = 0; i < 16; i++) h[i] = 0;
    } else if (TY == TY_Q4_0) {
        // Nibbles straight from the block: q - 8 = (1024 + q) - 1032.
        const u8* blk = row + (long long)u * 18;
        u32 v[5];
        int sh = ld_words<5>(blk, v);
        u32 sc = __funnelshift_rc(v[0], v[1], sh) & 0xFFFFu;
        u32 d = sc | (sc << 16);
        const u32 bias = 0x64086408u;  // 1032, 1032
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 q = __funnelshift_rc(v[i], v[i + 1], sh + 16);
            u32 lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
            h[2 * i] = h2_fma(h2_sub(h2_bytes01(lo), bias), d, 0);
            h[2 * i + 1] = h2_fma(h2_sub(h2_bytes23(lo), bias), d, 0);
            h[8 + 2 * i] = h2_fma(h2_sub(h2_bytes01(hi), bias), d, 0);
            h[8 + 2 * i + 1] = h2_fma(h2_sub(h2_bytes23(hi), bias), d, 0);
        }
    } else {
        int w[8];
        float a0, a1, b;
        decode_unit<TY>(row, u, w, a0, a1, b);
        u32 ha0 = pack_f16x2(a0, a0), ha1 = pack_f16x2(a1, a1), hb = pack_f16x2(b, b);
        const u32 bias = 0x64806480u;  // 1152 = 1024 + 128, the signed bytes' bias
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 x = (u32)w[i] ^ 0x80808080u;
            u32 ha = i < 4 ? ha0 : ha1;
            h[2 * i] = h2_fma(h2_sub(h2_bytes01(x), bias), ha, hb);
            h[2 * i + 1] = h2_fma(h2_sub(h2_bytes23(x), bias), ha, hb);
        }
    }
}

// decode_unit for the int8 dot of the fast and deterministic decode
// matvecs (mv_q8*, dl_row_dot): Q4_0 / Q5_0 keep their unsigned values
// (RAW) and take the offset as a minimum, B = -8 A (-16 A), against the
// activations' d * sum(q) (value = d_a A isum + B s_a), which saves the
// per-byte subtractions. The other types decode as decode_unit does.
template <int TY, int POL = 0>
__device__ __forceinline__ void decode_unit_q8(const u8* __restrict__ row, int u, int* w,
                                               float& a0, float& a1, float& b,
                                               unsigned long long pol = 0) {
    decode_unit<TY, POL, true>(row, u, w, a0, a1, b, pol);
    if (TY == TY_Q4_0) b = -8.0f * a0;
    if (TY == TY_Q5_0) b = -16.0f * a0;
}
