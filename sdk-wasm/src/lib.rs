//! The mpush browser SDK. Not implemented yet: see issue 6. This crate is an
//! empty placeholder so the workspace has its final shape.
