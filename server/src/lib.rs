//! The mpush reference server. Not implemented yet: see issue 3. This crate is
//! an empty placeholder so the workspace has its final shape.
