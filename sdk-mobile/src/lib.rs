//! The mpush Kotlin/Swift bindings. Not implemented yet: see issue 7. This
//! crate is an empty placeholder so the workspace has its final shape.
