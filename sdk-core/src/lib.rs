//! The mpush client core. Not implemented yet: see issue 4. This crate is an
//! empty placeholder so the workspace has its final shape.
