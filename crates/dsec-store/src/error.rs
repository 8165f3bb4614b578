//! What can go wrong in the store, engine-independent.

/// One error type for both engines, so callers never match on a driver's.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A principal, token or node with this key is already there.
    #[error("{0} already exists")]
    Exists(String),
    /// The principal a token or child was meant for does not exist.
    #[error("no principal {0:?}")]
    NoSuchPrincipal(String),
    /// The database cannot be reached now (down, restarting, the network);
    /// the same call may succeed later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The database was migrated by a newer dsec; this build does not guess
    /// at a schema it does not know.
    #[error("the database's schema is version {found}, newer than this build's {known}: upgrade dsec")]
    NewerSchema { found: i64, known: i64 },
    /// Another process holds the SQLite database (a SQLite store belongs to
    /// one apiserver; several replicas share a PostgreSQL one).
    #[error("the database {0} is in use by another process (several apiservers need --database postgres://...)")]
    InUse(String),
    /// A row the schema allows but this build cannot read.
    #[error("unreadable row in {table}: {detail}")]
    Corrupt { table: &'static str, detail: String },
    /// A quota that may not be set (zero, or above the parent's free share).
    #[error(transparent)]
    Quota(#[from] crate::QuotaError),
    /// A project that still has sub-projects cannot be deleted.
    #[error("project {0:?} has sub-projects: delete them first")]
    HasChildren(String),
    /// The token meant to issue another is revoked (or gone) by now.
    #[error("the issuing token is revoked")]
    IssuerRevoked,
    /// Any other failure of the engine (a bad URL, a full disk, a bug).
    #[error("database: {0}")]
    Engine(String),
}

impl StoreError {
    /// Whether retrying later may help (the caller answers 503 with
    /// Retry-After rather than 500).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match &e {
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) =>
            {
                StoreError::Unavailable(e.to_string())
            }
            _ => StoreError::Engine(e.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        use tokio_postgres::error::SqlState;
        let Some(code) = e.code() else {
            // No SQLSTATE: the connection itself failed (refused, closed,
            // timed out).
            return StoreError::Unavailable(e.to_string());
        };
        // Class 08: connection exceptions; 57P01-57P03: the server is
        // shutting down or starting; 53300: too many connections.
        let transient = code.code().starts_with("08")
            || [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW, SqlState::TOO_MANY_CONNECTIONS]
                .contains(code);
        if transient {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Engine(e.to_string())
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            // Timeouts waiting for or making a connection, a closed pool.
            other => StoreError::Unavailable(other.to_string()),
        }
    }
}
