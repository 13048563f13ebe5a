//! Stop/start, pause/unpause, snapshots (commit), forks and listing by label.

use super::*;

#[async_trait]
impl StopStart for DockerProvider {
    async fn stop(&self, id: &NativeId) -> Result<Transition> {
        self.engine
            .expect(
                Method::POST,
                &format!(
                    "/containers/{}/stop?t={}",
                    path_name(&id.0)?,
                    self.config.stop_timeout_secs
                ),
                None,
                &[StatusCode::NOT_MODIFIED],
            )
            .await?;
        self.settle(id, CanonicalState::Stopped).await
    }

    async fn start(&self, id: &NativeId) -> Result<Transition> {
        // The supervisor starts anew; until it answers, nothing is trusted.
        let _ = std::fs::remove_file(self.pin_path(&id.0)?);
        self.engine
            .expect(
                Method::POST,
                &format!("/containers/{}/start", path_name(&id.0)?),
                None,
                &[StatusCode::NOT_MODIFIED],
            )
            .await?;
        self.wait_ready(&id.0).await?;
        self.settle(id, CanonicalState::Running).await
    }
}

#[async_trait]
impl SuspendResume for DockerProvider {
    async fn suspend(&self, id: &NativeId) -> Result<Transition> {
        self.engine
            .expect(
                Method::POST,
                &format!("/containers/{}/pause", path_name(&id.0)?),
                None,
                &[],
            )
            .await?;
        self.settle(id, CanonicalState::Suspended).await
    }

    async fn resume(&self, id: &NativeId) -> Result<Transition> {
        self.engine
            .expect(
                Method::POST,
                &format!("/containers/{}/unpause", path_name(&id.0)?),
                None,
                &[],
            )
            .await?;
        self.settle(id, CanonicalState::Running).await
    }
}

/// The tag (in the `berth-snapshot` repository) of the image a fork named `fork` starts from.
pub(crate) fn fork_image_tag(fork: &str) -> String {
    format!("fork-{fork}")
}

impl DockerProvider {
    /// Removes every image made for the fork named `fork`: the tagged one and any a killed
    /// call's commit finished untagged (404: none; 409: a container still uses it, and it
    /// stays).
    pub(crate) async fn remove_fork_image(&self, fork: &str) -> Result<()> {
        // By reference first: the tag (all an image made before the label had) goes, and the
        // image with it unless another name still holds it.
        let reference = format!("berth-snapshot:{}", fork_image_tag(fork));
        let untagged = self
            .remove_images(&[reference], &[StatusCode::CONFLICT])
            .await;
        let images = self.images_made_for(&format!("fork:{fork}")).await?;
        untagged?;
        self.remove_images(&images, &[StatusCode::CONFLICT]).await?;
        // Housekeeping: what killed commits left for keys and forks long deleted.
        let _ = self.remove_abandoned_commits().await;
        Ok(())
    }
}

pub(crate) fn snapshot_tag(id: &NativeId) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{}-{millis}", id.0)
}

impl DockerProvider {
    /// The image a tag in the `berth-snapshot` repository names now, if any.
    pub(crate) async fn tagged_image(&self, tag: &str) -> Result<Option<String>> {
        #[derive(Deserialize)]
        struct ImageId {
            #[serde(rename = "Id")]
            id: String,
        }
        let reference = format!("berth-snapshot:{tag}");
        let path = format!("/images/{}/json", path_name(&reference)?);
        let response = self.engine.request(Method::GET, &path, None).await?;
        if response.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = engine::ok(&path, response)?;
        let found: ImageId = serde_json::from_slice(&response.body)
            .map_err(|e| err(ErrorKind::Unknown, "unexpected image answer").with_source(e))?;
        Ok(Some(found.id))
    }

    /// Every image made for the snapshot key `key`: labelled for it, or (made before images
    /// carried the label) tagged with it.
    async fn images_keyed(&self, key: &str) -> Result<Vec<String>> {
        let mut images = self.images_made_for(&format!("key:{key}")).await?;
        if let Some(tagged) = self.tagged_image(&format!("key-{key}")).await? {
            if !images.contains(&tagged) {
                images.push(tagged);
            }
        }
        Ok(images)
    }

    pub(crate) async fn snapshot_ref(&self, image: String) -> Result<SnapshotRef> {
        #[derive(Deserialize)]
        struct ImageInfo {
            #[serde(rename = "Size")]
            size: Option<u64>,
        }
        let size = self
            .engine
            .json::<ImageInfo>(
                Method::GET,
                &format!("/images/{}/json", path_name(&image)?),
                None,
            )
            .await
            .ok()
            .and_then(|i| i.size);
        Ok(SnapshotRef {
            handle: image,
            kind: SnapshotHandleKind::Digest,
            size_bytes: size,
        })
    }
}

#[async_trait]
impl Snapshots for DockerProvider {
    async fn snapshot_keyed(&self, id: &NativeId, key: &str) -> Result<SnapshotRef> {
        berth_contract::check_snapshot_key(key).map_err(|m| err(ErrorKind::InvalidRequest, m))?;
        let image = self
            .commit(id, &format!("key:{key}"), &format!("key-{key}"))
            .await?;
        // Made for the key before: a replaced image, or one a killed call's commit finished.
        let earlier: Vec<String> = self
            .images_keyed(key)
            .await?
            .into_iter()
            .filter(|e| *e != image)
            .collect();
        let _ = self.remove_images(&earlier, &[]).await;
        let _ = self.remove_abandoned_commits().await;
        self.snapshot_ref(image).await
    }

    async fn delete_keyed(&self, key: &str) -> Result<()> {
        berth_contract::check_snapshot_key(key).map_err(|m| err(ErrorKind::InvalidRequest, m))?;
        // By id, so each image goes, not just the tag (409: a container still uses it).
        let images = self.images_keyed(key).await?;
        self.remove_images(&images, &[]).await?;
        let _ = self.remove_abandoned_commits().await;
        Ok(())
    }

    async fn snapshot(&self, id: &NativeId) -> Result<SnapshotRef> {
        let image = self.commit(id, "snapshot", &snapshot_tag(id)).await?;
        self.snapshot_ref(image).await
    }

    async fn restore(&self, snapshot: &SnapshotRef, req: &CreateRequest) -> Result<Created> {
        self.image_present(&snapshot.handle).await?;
        self.create_container(req, &snapshot.handle, BTreeMap::new())
            .await
    }

    async fn delete_snapshot(&self, snapshot: &SnapshotRef) -> Result<()> {
        self.engine
            .expect(
                Method::DELETE,
                &format!("/images/{}", path_name(&snapshot.handle)?),
                None,
                &[StatusCode::NOT_FOUND],
            )
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Fork for DockerProvider {
    async fn fork(&self, id: &NativeId, req: &CreateRequest) -> Result<Created> {
        // The fork's image is named after the fork, so the fork's own ledger row (recorded
        // before this call) covers it: destroying the fork by name removes the image even when
        // a crash came between the commit and the container. A leftover from such a crash is
        // removed first, so a retried fork never strands an untagged image.
        let tag = fork_image_tag(&req.name.0);
        self.remove_fork_image(&req.name.0).await?;
        let image = self
            .commit(id, &format!("fork:{}", req.name.0), &tag)
            .await?;
        let labels = BTreeMap::from([(FORK_IMAGE_LABEL.to_owned(), image.clone())]);
        match self.create_container(req, &image, labels).await {
            Ok(created) => Ok(created),
            Err(e) => {
                let _ = self
                    .engine
                    .request(
                        Method::DELETE,
                        &format!("/images/{}", path_name(&image)?),
                        None,
                    )
                    .await;
                Err(e)
            }
        }
    }
}

#[async_trait]
impl Listing for DockerProvider {
    async fn list(&self, filter: &LabelFilter) -> Result<Vec<Listed>> {
        let mut labels = vec![berth_contract::labels::OWNER.to_owned()];
        if let Some(owner) = &filter.owner {
            labels[0] = format!("{}={owner}", berth_contract::labels::OWNER);
        }
        if let Some(run) = &filter.run_id {
            labels.push(format!("{}={run}", berth_contract::labels::RUN));
        }
        let filters = serde_json::json!({ "label": labels }).to_string();
        #[derive(Deserialize)]
        struct Summary {
            #[serde(rename = "Names", default)]
            names: Vec<String>,
            #[serde(rename = "State", default)]
            state: String,
            #[serde(rename = "Labels", default)]
            labels: Option<BTreeMap<String, String>>,
        }
        let containers: Vec<Summary> = self
            .engine
            .json(
                Method::GET,
                &format!(
                    "/containers/json?all=true&filters={}",
                    query_escape(&filters)
                ),
                None,
            )
            .await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let name = c.names.first()?.trim_start_matches('/').to_owned();
                let labels = c.labels.unwrap_or_default();
                filter.matches(&labels).then(|| Listed {
                    native_id: NativeId(name),
                    observation: Observation::Present {
                        state: canonical_state(&c.state, false),
                        raw: c.state.clone(),
                        soft_deleted: false,
                        labels,
                    },
                })
            })
            .collect())
    }
}
