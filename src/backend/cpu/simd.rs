//! Runtime SIMD detection. The AVX2 kernels need AVX2 and F16C (for f16
//! scale conversion); FMA is deliberately never used.

/// Instruction-set level chosen for a backend instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any target.
    Portable,
    /// x86-64 AVX2 + F16C.
    Avx2,
}

impl Isa {
    /// The best level this CPU supports, or `Portable` when forced.
    pub fn detect(force_portable: bool) -> Isa {
        if force_portable {
            return Isa::Portable;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}
