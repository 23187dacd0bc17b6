//! Parquet input.
