//! Transport records: what a transport speaking another system's API (E2B) keeps beside
//! warren's own rows, in the state store so every replica reads it alike. The provisioner
//! only passes them through; what they mean is the transport's business.

pub use warren_store::{RecordWrite, TransportRecord};

use crate::{Provisioner, ProvisionerError};

impl Provisioner {
    /// A transport record, if one exists.
    pub async fn get_record(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<TransportRecord>, ProvisionerError> {
        Ok(self.store.get_record(namespace, key).await?)
    }

    /// Writes a transport record when it is as `expected` says; its new version.
    /// `StoreError::RecordConflict` (inside [`ProvisionerError::Store`]) when another
    /// writer got there first: read again and retry.
    pub async fn put_record(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        expected: RecordWrite,
    ) -> Result<i64, ProvisionerError> {
        Ok(self
            .store
            .put_record(namespace, key, value, expected)
            .await?)
    }

    /// Deletes a transport record (only at version `expected`, when given).
    pub async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<i64>,
    ) -> Result<bool, ProvisionerError> {
        Ok(self.store.delete_record(namespace, key, expected).await?)
    }

    /// The transport records of `namespace` whose key starts with `prefix`.
    pub async fn list_records(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<TransportRecord>, ProvisionerError> {
        Ok(self.store.list_records(namespace, prefix).await?)
    }
}
