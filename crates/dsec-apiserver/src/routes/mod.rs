pub mod admin;
pub mod files;
pub mod sandboxes;
pub mod stream;
