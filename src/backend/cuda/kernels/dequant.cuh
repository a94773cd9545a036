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

__device__ __forceinline__ int gr_type_size(int ty) {
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
