//! The attention kernels' entry points, by form, head_dim class and group
//! class: the kernel table (`ops/kernels.rs`) loads them, `geometry.rs`
//! names the one a plan launches.

/// The pipelined split-attention entries of attention_pipe_fast.cu, indexed
/// [form][head_dim class][group class]:
/// `att_pipe{,_m,_w,_c,_m3}_d{2,4}_g{1,2,3,4,8}` (form: partials, merging,
/// partials with 8-key tiles, merging by a cluster, merging at
/// ATT_M3_STAGES stages), then `att_pipe8{_,_m_,_c_}d{2,4}_g{1,2,3,4,8}`
/// (the partials, merging and cluster forms at eight warps per CTA), then
/// `att_row_d{2,4}_g{1,2,3,4,8}` (one CTA per (row, KV head) folding the
/// whole row); ops/attention/geometry.rs, gqa_split_kernel, picks one.
pub const ATT_PIPE: [[[&str; 5]; 2]; 9] = [
    [
        [
            "att_pipe_d2_g1",
            "att_pipe_d2_g2",
            "att_pipe_d2_g3",
            "att_pipe_d2_g4",
            "att_pipe_d2_g8",
        ],
        [
            "att_pipe_d4_g1",
            "att_pipe_d4_g2",
            "att_pipe_d4_g3",
            "att_pipe_d4_g4",
            "att_pipe_d4_g8",
        ],
    ],
    [
        [
            "att_pipe_m_d2_g1",
            "att_pipe_m_d2_g2",
            "att_pipe_m_d2_g3",
            "att_pipe_m_d2_g4",
            "att_pipe_m_d2_g8",
        ],
        [
            "att_pipe_m_d4_g1",
            "att_pipe_m_d4_g2",
            "att_pipe_m_d4_g3",
            "att_pipe_m_d4_g4",
            "att_pipe_m_d4_g8",
        ],
    ],
    [
        [
            "att_pipe_w_d2_g1",
            "att_pipe_w_d2_g2",
            "att_pipe_w_d2_g3",
            "att_pipe_w_d2_g4",
            "att_pipe_w_d2_g8",
        ],
        [
            "att_pipe_w_d4_g1",
            "att_pipe_w_d4_g2",
            "att_pipe_w_d4_g3",
            "att_pipe_w_d4_g4",
            "att_pipe_w_d4_g8",
        ],
    ],
    [
        [
            "att_pipe_c_d2_g1",
            "att_pipe_c_d2_g2",
            "att_pipe_c_d2_g3",
            "att_pipe_c_d2_g4",
            "att_pipe_c_d2_g8",
        ],
        [
            "att_pipe_c_d4_g1",
            "att_pipe_c_d4_g2",
            "att_pipe_c_d4_g3",
            "att_pipe_c_d4_g4",
            "att_pipe_c_d4_g8",
        ],
    ],
    [
        [
            "att_pipe_m3_d2_g1",
            "att_pipe_m3_d2_g2",
            "att_pipe_m3_d2_g3",
            "att_pipe_m3_d2_g4",
            "att_pipe_m3_d2_g8",
        ],
        [
            "att_pipe_m3_d4_g1",
            "att_pipe_m3_d4_g2",
            "att_pipe_m3_d4_g3",
            "att_pipe_m3_d4_g4",
            "att_pipe_m3_d4_g8",
        ],
    ],
    [
        [
            "att_pipe8_d2_g1",
            "att_pipe8_d2_g2",
            "att_pipe8_d2_g3",
            "att_pipe8_d2_g4",
            "att_pipe8_d2_g8",
        ],
        [
            "att_pipe8_d4_g1",
            "att_pipe8_d4_g2",
            "att_pipe8_d4_g3",
            "att_pipe8_d4_g4",
            "att_pipe8_d4_g8",
        ],
    ],
    [
        [
            "att_pipe8_m_d2_g1",
            "att_pipe8_m_d2_g2",
            "att_pipe8_m_d2_g3",
            "att_pipe8_m_d2_g4",
            "att_pipe8_m_d2_g8",
        ],
        [
            "att_pipe8_m_d4_g1",
            "att_pipe8_m_d4_g2",
            "att_pipe8_m_d4_g3",
            "att_pipe8_m_d4_g4",
            "att_pipe8_m_d4_g8",
        ],
    ],
    [
        [
            "att_pipe8_c_d2_g1",
            "att_pipe8_c_d2_g2",
            "att_pipe8_c_d2_g3",
            "att_pipe8_c_d2_g4",
            "att_pipe8_c_d2_g8",
        ],
        [
            "att_pipe8_c_d4_g1",
            "att_pipe8_c_d4_g2",
            "att_pipe8_c_d4_g3",
            "att_pipe8_c_d4_g4",
            "att_pipe8_c_d4_g8",
        ],
    ],
    [
        [
            "att_row_d2_g1",
            "att_row_d2_g2",
            "att_row_d2_g3",
            "att_row_d2_g4",
            "att_row_d2_g8",
        ],
        [
            "att_row_d4_g1",
            "att_row_d4_g2",
            "att_row_d4_g3",
            "att_row_d4_g4",
            "att_row_d4_g8",
        ],
    ],
];

/// The tensor-core row form's entries (attention_rmma_fast.cu),
/// [form][head_dim class][group class]: `att_rmma_d{2,4}_g{1,2,3,4,8}`
/// (one CTA per (row, KV head) folding the whole row with m16n8k16 MMAs)
/// and `att_rmma_c_d{2,4}_g{1,2,3,4,8}` (a thread-block cluster of CTAs
/// per (row, KV head), merged in rank 0); gqa_split_kernel picks one for
/// `SplitForm::RowMma` / `SplitForm::RowMmaCluster`.
pub const ATT_RMMA: [[[&str; 5]; 2]; 2] = [
    [
        [
            "att_rmma_d2_g1",
            "att_rmma_d2_g2",
            "att_rmma_d2_g3",
            "att_rmma_d2_g4",
            "att_rmma_d2_g8",
        ],
        [
            "att_rmma_d4_g1",
            "att_rmma_d4_g2",
            "att_rmma_d4_g3",
            "att_rmma_d4_g4",
            "att_rmma_d4_g8",
        ],
    ],
    [
        [
            "att_rmma_c_d2_g1",
            "att_rmma_c_d2_g2",
            "att_rmma_c_d2_g3",
            "att_rmma_c_d2_g4",
            "att_rmma_c_d2_g8",
        ],
        [
            "att_rmma_c_d4_g1",
            "att_rmma_c_d4_g2",
            "att_rmma_c_d4_g3",
            "att_rmma_c_d4_g4",
            "att_rmma_c_d4_g8",
        ],
    ],
];

/// ATT_RMMA's entries in order.
pub(crate) const ATT_RMMA_ENTRIES: [&str; 20] = {
    let mut out = [""; 20];
    let mut j = 0;
    while j < 20 {
        out[j] = ATT_RMMA[j / 10][(j / 5) % 2][j % 5];
        j += 1;
    }
    out
};

/// attention_fast.cu's kernels (the pipelined ones are in
/// attention_pipe_fast.cu).
pub(crate) const ATT_FAST_HEAD: [&str; 4] = [
    "paged_attention_fast",
    "paged_attention_split",
    "attention_combine",
    "attention_combine_d128",
];
/// The entries of each part of attention_pipe_fast.cu, indexed [head_dim
/// class][group class]: every form of ATT_PIPE at that class pair (the
/// kernel table compiles the file once per part).
pub(crate) const ATT_PIPE_PARTS: [[[&str; ATT_PIPE.len()]; 5]; 2] = {
    let mut out = [[[""; ATT_PIPE.len()]; 5]; 2];
    let mut d = 0;
    while d < 2 {
        let mut g = 0;
        while g < 5 {
            let mut f = 0;
            while f < ATT_PIPE.len() {
                out[d][g][f] = ATT_PIPE[f][d][g];
                f += 1;
            }
            g += 1;
        }
        d += 1;
    }
    out
};
