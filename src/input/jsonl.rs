//! JSON Lines input.
