// The ComputeSDK providers the bridge drives and how each is built: shared by the sidecar and
// by bench-direct.mjs, so the benchmark's baseline drives exactly what Berth drives.

// ComputeSDK's own provider packages, each built with its defaults; credentials come from the
// environment Berth hands this process (only the variables the provider's manifest names).
// modal: `daemonSsePort: false` keeps ComputeSDK from exposing a port for its streaming daemon.
// `noNetwork`: the vendor's own create option for a sandbox without network (Berth's default),
// which ComputeSDK passes through to the vendor SDK untouched; just-bash has no network at all.
// `imageOption`: the create option ComputeSDK's adapter boots an image or template from
// (e2b and modal read `templateId`, daytona passes `image` on); just-bash has none, and Berth
// refuses an image for it before asking.
export const VENDORS = {
  'just-bash': { pkg: '@computesdk/just-bash', make: (m) => m.justBash({}), noNetwork: {}, imageOption: null },
  e2b: {
    pkg: '@computesdk/e2b',
    make: (m) => m.e2b({}),
    noNetwork: { allowInternetAccess: false },
    imageOption: 'templateId',
  },
  daytona: {
    pkg: '@computesdk/daytona',
    make: (m) => m.daytona({}),
    noNetwork: { networkBlockAll: true },
    imageOption: 'image',
  },
  modal: {
    pkg: '@computesdk/modal',
    make: (m) => m.modal({ daemonSsePort: false }),
    noNetwork: { blockNetwork: true },
    imageOption: 'templateId',
  },
};
