//! A step's logits on the host, as an executor hands them to the sampler.

/// A step's logits on the host: a vector (host execution) or the
/// page-locked memory a device copied them into (read in place, no second
/// copy; it returns to the backend's pool when dropped).
#[derive(Debug)]
pub enum HostLogits {
    Vec(Vec<f32>),
    Pinned(crate::backend::cuda::PinnedLogits),
}

impl Default for HostLogits {
    fn default() -> Self {
        HostLogits::Vec(Vec::new())
    }
}

impl HostLogits {
    pub fn as_slice(&self) -> &[f32] {
        match self {
            HostLogits::Vec(v) => v,
            HostLogits::Pinned(p) => p.as_slice(),
        }
    }
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values as a vector (a copy for pinned memory).
    pub fn into_vec(self) -> Vec<f32> {
        match self {
            HostLogits::Vec(v) => v,
            HostLogits::Pinned(p) => p.as_slice().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HostLogits;

    #[test]
    fn host_logits_vec_reads_in_place() {
        let v = vec![0.5f32, -1.25, 3.0];
        let ptr = v.as_ptr();
        let l = HostLogits::Vec(v);
        assert_eq!(l.len(), 3);
        assert!(!l.is_empty());
        assert_eq!(l.as_slice(), &[0.5, -1.25, 3.0]);
        // The host vector moves out without a copy.
        let back = l.into_vec();
        assert_eq!(back.as_ptr(), ptr);
        assert!(HostLogits::default().is_empty());
    }
}
