//! The contract's traits for [`LocalProvider`]: each call is the provider's own `*_inner`
//! step, with errors attributed to the adapter that wraps the machinery.

use super::*;

#[async_trait]
impl<L: Launcher> Provider for LocalProvider<L> {
    fn id(&self) -> &str {
        self.launcher.id()
    }

    async fn create(&self, req: &CreateRequest) -> Result<Created> {
        self.create_from(req, None).await.map_err(|e| self.own(e))
    }

    async fn observe(&self, id: &NativeId) -> Result<Observation> {
        self.observe_inner(id).await.map_err(|e| self.own(e))
    }

    async fn exec(&self, id: &NativeId, req: &ExecRequest) -> Result<ExecOutput> {
        let finished = self
            .run(id, req, process::Sink::Capture(req.max_output_bytes))
            .await
            .map_err(|e| self.own(e))?;
        Ok(finished.into_output())
    }

    async fn destroy(&self, id: &NativeId) -> Result<DestroyOutcome> {
        self.destroy_inner(id).await.map_err(|e| self.own(e))
    }

    fn streaming(&self) -> Option<&dyn StreamingExec> {
        Some(self)
    }
    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }
    fn fork(&self) -> Option<&dyn Fork> {
        Some(self)
    }
    fn listing(&self) -> Option<&dyn Listing> {
        Some(self)
    }
    fn access(&self) -> Option<&dyn berth_contract::Access> {
        if self.launcher.interactive() {
            Some(self)
        } else {
            None
        }
    }
}

#[async_trait]
impl<L: Launcher> StreamingExec for LocalProvider<L> {
    async fn exec_streaming(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecSummary> {
        let finished = self
            .run(id, req, process::Sink::Stream(sink))
            .await
            .map_err(|e| self.own(e))?;
        Ok(finished.into_summary())
    }
}

#[async_trait]
impl<L: Launcher> Files for LocalProvider<L> {
    async fn read(&self, id: &NativeId, path: &str) -> Result<Vec<u8>> {
        self.read_inner(id, path).await.map_err(|e| self.own(e))
    }

    async fn read_to(
        &self,
        id: &NativeId,
        path: &str,
        sink: berth_contract::FileSink,
    ) -> Result<(berth_contract::FileSink, u64)> {
        self.read_to_inner(id, path, sink)
            .await
            .map_err(|e| self.own(e))
    }

    async fn write(&self, id: &NativeId, path: &str, bytes: &[u8]) -> Result<()> {
        self.write_inner(id, path, bytes)
            .await
            .map_err(|e| self.own(e))
    }

    async fn write_from(
        &self,
        id: &NativeId,
        path: &str,
        source: berth_contract::FileSource,
    ) -> Result<()> {
        self.write_from_inner(id, path, source)
            .await
            .map_err(|e| self.own(e))
    }

    async fn list(&self, id: &NativeId, path: &str) -> Result<Vec<FileEntry>> {
        self.list_inner(id, path).await.map_err(|e| self.own(e))
    }
}

#[async_trait]
impl<L: Launcher> Snapshots for LocalProvider<L> {
    async fn snapshot(&self, id: &NativeId) -> Result<SnapshotRef> {
        self.snapshot_inner(id).await.map_err(|e| self.own(e))
    }

    async fn snapshot_keyed(&self, id: &NativeId, key: &str) -> Result<SnapshotRef> {
        berth_contract::check_snapshot_key(key).map_err(|m| {
            self.own(ProviderError::new(
                ErrorKind::InvalidRequest,
                PROVIDER_ID,
                m,
            ))
        })?;
        let snap = self.snapshot_inner(id).await.map_err(|e| self.own(e))?;
        let store = self.layout.snapshots();
        let (key, handle) = (key.to_owned(), snap.handle.clone());
        blocking(move || archive::name_snapshot(&store, &key, &handle))
            .await
            .map_err(|e| self.own(e))?;
        Ok(snap)
    }

    async fn delete_keyed(&self, key: &str) -> Result<()> {
        berth_contract::check_snapshot_key(key).map_err(|m| {
            self.own(ProviderError::new(
                ErrorKind::InvalidRequest,
                PROVIDER_ID,
                m,
            ))
        })?;
        let store = self.layout.snapshots();
        let key = key.to_owned();
        blocking(move || archive::delete_named(&store, &key))
            .await
            .map_err(|e| self.own(e))
    }

    async fn restore(&self, snapshot: &SnapshotRef, req: &CreateRequest) -> Result<Created> {
        self.restore_inner(snapshot, req)
            .await
            .map_err(|e| self.own(e))
    }

    async fn delete_snapshot(&self, snapshot: &SnapshotRef) -> Result<()> {
        self.delete_snapshot_inner(snapshot)
            .await
            .map_err(|e| self.own(e))
    }
}

#[async_trait]
impl<L: Launcher> Fork for LocalProvider<L> {
    async fn fork(&self, id: &NativeId, req: &CreateRequest) -> Result<Created> {
        self.fork_inner(id, req).await.map_err(|e| self.own(e))
    }
}

#[async_trait]
impl<L: Launcher> Listing for LocalProvider<L> {
    async fn list(&self, filter: &LabelFilter) -> Result<Vec<Listed>> {
        self.list_sandboxes(filter).await.map_err(|e| self.own(e))
    }

    /// The sandboxes are directories under this provider's state directory, which is private
    /// to one Berth home (the CLI keeps it 0700): nothing else makes them.
    fn scope(&self) -> berth_contract::ListingScope {
        berth_contract::ListingScope::ThisHome
    }
}
