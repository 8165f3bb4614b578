pub mod admin;
pub mod files;
pub mod fncall;
pub mod sandboxes;
pub mod stream;
