//! The images Berth commits (snapshots, keyed checkpoints, forks' images): made for a key or a
//! fork and tagged by the call that made them, and removed with what they were made for —
//! also when a killed call's commit finished after it.

use super::*;

impl DockerProvider {
    /// Commits `id` to an image labelled as made for `made_for` ([`IMAGE_FOR_LABEL`]), then
    /// tags it `berth-snapshot:<tag>`. The engine is asked for no tag: a commit whose caller was
    /// killed goes on in the engine, and tagged it would take the tag after Berth had moved on
    /// (seen: 1.6 s after its container was removed), so an image only gets its tag from the
    /// call that is still there to record it.
    pub(crate) async fn commit(&self, id: &NativeId, made_for: &str, tag: &str) -> Result<String> {
        #[derive(Deserialize)]
        struct Committed {
            #[serde(rename = "Id")]
            id: String,
        }
        let change = format!("LABEL {IMAGE_FOR_LABEL}={made_for}");
        let committed: Committed = self
            .engine
            .json(
                Method::POST,
                &format!(
                    "/commit?container={}&pause=true&changes={}",
                    query_escape(&id.0),
                    query_escape(&change)
                ),
                Some(serde_json::json!({})),
            )
            .await?;
        let tagged = self
            .engine
            .expect(
                Method::POST,
                &format!(
                    "/images/{}/tag?repo=berth-snapshot&tag={}",
                    path_name(&committed.id)?,
                    query_escape(tag)
                ),
                None,
                &[],
            )
            .await;
        if let Err(e) = tagged {
            let _ = self.remove_images(&[committed.id], &[]).await;
            return Err(e);
        }
        Ok(committed.id)
    }

    /// The engine's images matching `filters` (the images/json filter document).
    async fn images_matching(&self, filters: serde_json::Value) -> Result<Vec<ImageSummary>> {
        self.engine
            .json(
                Method::GET,
                &format!(
                    "/images/json?all=true&filters={}",
                    query_escape(&filters.to_string())
                ),
                None,
            )
            .await
    }

    /// Every image Berth committed for `made_for`, tagged or not.
    pub(crate) async fn images_made_for(&self, made_for: &str) -> Result<Vec<String>> {
        let filters = serde_json::json!({ "label": [format!("{IMAGE_FOR_LABEL}={made_for}")] });
        let images = self.images_matching(filters).await?;
        Ok(images.into_iter().map(|i| i.id).collect())
    }

    /// Removes the images committed for a key or a fork that are still untagged
    /// [`ABANDONED_AFTER`] after they were made: the call that commits tags at once, so such an
    /// image is a commit the engine finished for a caller that was killed, possibly after its
    /// key or fork was deleted (nothing else would ever name it). Plain snapshots are never
    /// touched: a user's restore names them by digest. Returns what was removed (an image a
    /// container still uses stays, and is not counted); every image is tried, and a failure
    /// is returned naming what was removed before it.
    pub(crate) async fn remove_abandoned_commits(&self) -> Result<Vec<AbandonedCommit>> {
        let filters = serde_json::json!({ "label": [IMAGE_FOR_LABEL], "dangling": ["true"] });
        let images = self.images_matching(filters).await?;
        // The engine is local (its socket): its clock is this one.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let abandoned: Vec<AbandonedCommit> = images
            .into_iter()
            .filter_map(|image| {
                let made_for = image
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(IMAGE_FOR_LABEL))
                    .cloned()
                    .unwrap_or_default();
                ((made_for.starts_with("key:") || made_for.starts_with("fork:"))
                    && image.created > 0
                    && image.created + ABANDONED_AFTER.as_secs() as i64 <= now)
                    .then_some(AbandonedCommit {
                        image: image.id,
                        made_for,
                        age_secs: now - image.created,
                    })
            })
            .collect();
        let ids: Vec<String> = abandoned.iter().map(|c| c.image.clone()).collect();
        let (gone, failure) = self.delete_images(&ids, &[StatusCode::CONFLICT]).await?;
        let removed: Vec<AbandonedCommit> = abandoned
            .into_iter()
            .zip(gone)
            .filter_map(|(commit, gone)| gone.then_some(commit))
            .collect();
        match failure {
            None => Ok(removed),
            Some(e) if removed.is_empty() => Err(e),
            Some(e) => Err(err(
                e.kind(),
                format!(
                    "{e} (removed before it: {})",
                    removed
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            )),
        }
    }

    /// Removes `images` by id, so the image goes and not just a tag; already gone (404, or the
    /// engine's 500 saying so) is always fine, and so is any status in `also_ok`. Every image is tried; the first failure
    /// is returned.
    pub(crate) async fn remove_images(
        &self,
        images: &[String],
        also_ok: &[StatusCode],
    ) -> Result<()> {
        let (_, failure) = self.delete_images(images, also_ok).await?;
        failure.map_or(Ok(()), Err)
    }

    /// Asks the engine to delete each of `images` by id: for each, whether it was deleted now
    /// (not already gone, not kept with a status in `also_ok`), and the first failure.
    async fn delete_images(
        &self,
        images: &[String],
        also_ok: &[StatusCode],
    ) -> Result<(Vec<bool>, Option<ProviderError>)> {
        let also_ok: Vec<StatusCode> = [StatusCode::NOT_FOUND]
            .into_iter()
            .chain(also_ok.iter().copied())
            .collect();
        let mut deleted = Vec::with_capacity(images.len());
        let mut first_failure = None;
        for image in images {
            let answer = self
                .engine
                .expect(
                    Method::DELETE,
                    &format!("/images/{}", path_name(image)?),
                    None,
                    &also_ok,
                )
                .await;
            deleted.push(answer.as_ref().is_ok_and(|r| r.status.is_success()));
            match answer {
                // Gone by another call meanwhile (some engines say so with a 500).
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    first_failure.get_or_insert(e);
                }
                Ok(_) => {}
            }
        }
        Ok((deleted, first_failure))
    }
}

/// An image [`DockerProvider::remove_abandoned_commits`] removed.
#[derive(Debug)]
pub(crate) struct AbandonedCommit {
    /// The image's id.
    pub(crate) image: String,
    /// What it was committed for (`key:<key>` or `fork:<name>`).
    pub(crate) made_for: String,
    /// How long before its removal the engine made it, in seconds.
    pub(crate) age_secs: i64,
}

impl std::fmt::Display for AbandonedCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "image {} committed for `{}` {} s before, left untagged by a killed call",
            self.image, self.made_for, self.age_secs
        )
    }
}

/// One image as the engine's image list gives it.
#[derive(Deserialize)]
struct ImageSummary {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "Created", default)]
    created: i64,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}
