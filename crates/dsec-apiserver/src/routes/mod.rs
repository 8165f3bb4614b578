pub mod admin;
pub mod events;
pub mod files;
pub mod fncall;
pub mod jobs;
pub mod pause;
pub mod sandboxes;
pub mod stream;
