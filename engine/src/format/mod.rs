//! The file formats: the colibri container's manifest and its checksums, the quantized
//! encodings, and the tensor table of Hugging Face safetensors checkpoints.

pub mod manifest;
pub mod quant;
pub mod tensors;
