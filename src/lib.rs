//! prep: offline dataset preparation for LLM pretraining.
pub mod input;
