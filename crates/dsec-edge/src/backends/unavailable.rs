//! Why a backend, or a backend's network, is not available on this node.
//! The message of each is the reason a refused request is given, so it
//! names what to install or which flag to pass.

use std::path::PathBuf;

/// Why the node runs no sandboxes of a backend.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("the edge was started without {0} support")]
    NotConfigured(&'static str),
    /// A program the backend runs is not installed.
    #[error("{} not found (Debian package {package})", .program.display())]
    MissingProgram { program: PathBuf, package: &'static str },
    /// A file a package installs (firmware) is not there.
    #[error("{} not found (Debian package {package})", .path.display())]
    MissingFile { path: PathBuf, package: &'static str },
    /// The microVM kernel, or the initramfs built around the agent.
    #[error("{what}: {source}")]
    Image {
        what: &'static str,
        #[source]
        source: dsec_image::BuildError,
    },
    /// A directory of the backend's state.
    #[error("creating {}: {source}", .path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Unavailable {
    /// For `map_err` on creating the directory `path`.
    pub fn state_dir(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Unavailable + '_ {
        move |source| Unavailable::StateDir { path: path.to_path_buf(), source }
    }
}

/// Why a backend's sandboxes cannot have network rules on this node.
#[derive(Debug, thiserror::Error)]
pub enum NoNetwork {
    #[error("outbound network is not enabled on this node")]
    EgressOff,
    #[error("the microVM kernel in {} has no NIC driver (virtio_net): run `dsec image setup` again to fetch it", .0.display())]
    NoNicDriver(PathBuf),
}
