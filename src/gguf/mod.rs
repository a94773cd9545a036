//! GGUF v2/v3 reader (mmap) and writer.
