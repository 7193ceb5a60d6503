//! An S3-compatible store (I31) through the `object_store` crate: AWS S3, MinIO, Garage,
//! Ceph, s3s and the like. Every key lives under one prefix (one uid), so stores of two
//! uids in one bucket never share or see each other's objects.
//!
//! The engine is synchronous and runs on blocking threads; each call here waits for its
//! request on the runtime handle given at construction.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore as _, PutPayload};

use crate::{ObjectStore, SnapshotError};

/// Where an S3-compatible store is and how to sign requests to it.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Config {
    /// Endpoint URL, e.g. `https://s3.eu-west-1.amazonaws.com` or `http://127.0.0.1:9000`.
    pub endpoint: String,
    /// The bucket (it must exist).
    pub bucket: String,
    /// The region name the endpoint expects (any for most self-hosted servers).
    pub region: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// A store under `prefix` in an S3-compatible bucket.
pub struct S3Store {
    client: Arc<dyn object_store::ObjectStore>,
    prefix: String,
    runtime: tokio::runtime::Handle,
}

fn s3_error(operation: &'static str, error: object_store::Error) -> SnapshotError {
    SnapshotError::store(operation, std::io::Error::other(error.to_string()))
}

impl S3Store {
    /// A store whose keys all start with `prefix/`, waiting for requests on `runtime`.
    pub fn open(
        config: &S3Config,
        prefix: &str,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, SnapshotError> {
        let client = AmazonS3Builder::new()
            .with_endpoint(&config.endpoint)
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false)
            .build()
            .map_err(|e| s3_error("connect to S3", e))?;
        Ok(Self {
            client: Arc::new(client),
            prefix: prefix.trim_matches('/').to_owned(),
            runtime,
        })
    }

    fn path(&self, key: &str) -> Result<ObjectPath, SnapshotError> {
        crate::store::check_key(key)?;
        Ok(ObjectPath::from(format!("{}/{key}", self.prefix)))
    }

    /// One GET with `options`; `None` when the object does not exist.
    fn fetch(
        &self,
        key: &str,
        options: object_store::GetOptions,
    ) -> Result<Option<Vec<u8>>, SnapshotError> {
        let path = self.path(key)?;
        self.runtime.block_on(async {
            match self.client.get_opts(&path, options).await {
                Ok(result) => result
                    .bytes()
                    .await
                    .map(|bytes| Some(bytes.to_vec()))
                    .map_err(|e| s3_error("read an object", e)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(error) => Err(s3_error("read an object", error)),
            }
        })
    }

    fn head(&self, key: &str) -> Result<Option<object_store::ObjectMeta>, SnapshotError> {
        let path = self.path(key)?;
        match self.runtime.block_on(self.client.head(&path)) {
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(s3_error("look up an object", error)),
        }
    }
}

impl ObjectStore for S3Store {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<bool, SnapshotError> {
        // Objects are named by their content: a racing writer puts the same bytes.
        if self.head(key)?.is_some() {
            return Ok(false);
        }
        let path = self.path(key)?;
        self.runtime
            .block_on(self.client.put(&path, PutPayload::from(bytes.to_vec())))
            .map_err(|e| s3_error("write an object", e))?;
        Ok(true)
    }

    fn get_range(
        &self,
        key: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, SnapshotError> {
        // One ranged GET; a range past the end is cut to it, as S3 does.
        self.fetch(
            key,
            object_store::GetOptions {
                range: Some(object_store::GetRange::Bounded(
                    offset..offset.saturating_add(len),
                )),
                ..Default::default()
            },
        )
    }

    fn parallel_reads(&self) -> usize {
        // Measured against s3s-fs on loopback (the cluster benchmark's resume row): a
        // 200 MiB restore took 1.5x one GET of its bytes one read at a time, 1.44-1.67x
        // two at a time, 1.15-1.25x four, 1.17x six.
        4
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, SnapshotError> {
        self.fetch(key, object_store::GetOptions::default())
    }

    fn contains(&self, key: &str) -> Result<bool, SnapshotError> {
        Ok(self.head(key)?.is_some())
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, SnapshotError> {
        // Listed beneath the key's kind (`chunks`, `packs`, ...): one kind's objects, not
        // the owner's whole store.
        let kind = prefix.split('/').next().unwrap_or_default();
        let base = if kind.is_empty() {
            ObjectPath::from(self.prefix.clone())
        } else {
            ObjectPath::from(format!("{}/{kind}", self.prefix))
        };
        let strip = format!("{}/", self.prefix);
        let metas: Vec<object_store::ObjectMeta> = self
            .runtime
            .block_on(self.client.list(Some(&base)).try_collect())
            .map_err(|e| s3_error("list the store", e))?;
        let mut keys: Vec<String> = metas
            .into_iter()
            .filter_map(|meta| {
                meta.location
                    .as_ref()
                    .strip_prefix(&strip)
                    .map(str::to_owned)
            })
            .filter(|key| key.starts_with(prefix))
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<(), SnapshotError> {
        let path = self.path(key)?;
        match self.runtime.block_on(self.client.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(s3_error("delete an object", error)),
        }
    }

    fn age(&self, key: &str) -> Result<Option<Duration>, SnapshotError> {
        Ok(self.head(key)?.map(|meta| {
            (chrono::Utc::now() - meta.last_modified)
                .to_std()
                .unwrap_or_default()
        }))
    }

    fn sync(&self) -> Result<(), SnapshotError> {
        // A PUT is durable once S3 acknowledged it.
        Ok(())
    }
}
