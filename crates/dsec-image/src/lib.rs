//! Images and layers of dsec.
//!
//! A sandbox's root filesystem is an overlay of read-only EROFS layers (a
//! base image, optionally a workspace and toolkits; the topmost wins) under
//! a writable upper. This crate
//! - stores layers as content-addressed EROFS blobs and images as versioned
//!   JSON manifests naming them ([`ImageStore`]);
//! - builds layers with `mkfs.erofs` from a directory, a tar(.gz), a
//!   debootstrap run or a busybox recipe ([`build`]), and the platform's
//!   default images ([`ensure_default_images`]);
//! - imports OCI images (layouts, `docker save` archives, registries) as
//!   layers, OCI whiteouts turned into overlayfs ones ([`oci`]);
//! - mounts layers on the host once per node for every overlay to share
//!   ([`LayerMounts`]);
//! - shares images between nodes through a directory or an S3-compatible
//!   store ([`shared`]) and loads their layers on demand, chunk by chunk,
//!   through a FUSE file under the EROFS mount ([`lazy`]);
//! - fetches the microVM guest kernel and builds its initramfs ([`vm`]).

pub mod build;
mod defaults;
mod digest;
pub mod erofs;
mod fsutil;
pub mod lazy;
mod manifest;
pub mod mountinfo;
mod mounts;
pub mod oci;
pub mod pack;
mod progress;
mod reference;
pub mod shared;
mod store;
mod time;
pub use time::rfc3339_millis;
pub mod vm;

pub use build::{BuildError, BuildOptions, Compression};
pub use defaults::{
    build_default_image, ensure_default_images, find_default_image, unrecorded_hint, DefaultImage, Ensured, Found, PYTHON_PACKAGES,
    PYTHON_SUITE,
};
pub use digest::{Digest, DigestError};
pub use manifest::{HealthcheckConfig, ImageConfig, LayerDescriptor, LayerKind, Manifest, ManifestError, Provenance, SCHEMA_VERSION};
pub use mounts::{LayerMounts, MountError};
pub use progress::{NoProgress, Progress, ProgressEvent, ProgressFn, Unit};
pub use reference::{Reference, ReferenceError, DEFAULT_TAG};
pub use store::{GcStats, ImageEntry, ImageError, ImageStore, ResolvedImage, ResolvedLayer, StoredLayer, WriteLock};
