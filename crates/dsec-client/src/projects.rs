//! Projects, their quotas and scoped tokens.

use dsec_api as api;
use http::Method;

use crate::{Client, ClientError};

/// A project path in a URL: each segment escaped, the slashes kept.
fn path_of(project: &str) -> String {
    project.split('/').map(|s| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()).collect::<Vec<_>>().join("/")
}

impl Client {
    pub async fn create_project(&self, name: &str, quota: Option<api::QuotaSpec>) -> Result<api::ProjectInfo, ClientError> {
        let req = api::CreateProjectRequest { name: name.to_string(), quota };
        self.json(Method::POST, "/v1/projects", Some(&req)).await
    }

    pub async fn projects(&self) -> Result<api::ProjectList, ClientError> {
        self.json::<(), _>(Method::GET, "/v1/projects", None).await
    }

    pub async fn project(&self, name: &str) -> Result<api::ProjectInfo, ClientError> {
        self.json::<(), _>(Method::GET, &format!("/v1/projects/{}", path_of(name)), None).await
    }

    /// Sets (`None`: removes) a project's quota.
    pub async fn set_quota(&self, name: &str, quota: Option<api::QuotaSpec>) -> Result<api::ProjectInfo, ClientError> {
        self.json(Method::PATCH, &format!("/v1/projects/{}", path_of(name)), Some(&api::UpdateProjectRequest { quota })).await
    }

    pub async fn delete_project(&self, name: &str) -> Result<(), ClientError> {
        self.raw(Method::DELETE, &format!("/v1/projects/{}", path_of(name)), None, "").await.map(|_| ())
    }

    pub async fn create_token(&self, project: &str, role: Option<&str>, ttl_s: Option<i64>) -> Result<api::TokenInfo, ClientError> {
        let req = api::CreateTokenRequest { project: project.to_string(), role: role.map(str::to_string), ttl_s };
        self.json(Method::POST, "/v1/tokens", Some(&req)).await
    }

    pub async fn tokens(&self) -> Result<api::TokenList, ClientError> {
        self.json::<(), _>(Method::GET, "/v1/tokens", None).await
    }

    pub async fn revoke_token(&self, id: &str) -> Result<(), ClientError> {
        let id: String = form_urlencoded::byte_serialize(id.as_bytes()).collect();
        self.raw(Method::DELETE, &format!("/v1/tokens/{id}"), None, "").await.map(|_| ())
    }
}
