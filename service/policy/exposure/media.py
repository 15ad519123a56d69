"""Which media URLs a request may make the server fetch (image, audio and video parts of multimodal requests).
vLLM fetches from anywhere by default, following redirects: from inside a cluster that is a request forgery
(SSRF) into every private address the pod reaches. Unless the user lists domains (media_domains), none is allowed;
inline data: URLs still work. Redirects are never followed: a listed domain could redirect anywhere."""

from __future__ import annotations

from service.policy.plan.decision import PolicyResult, engine, env

# vLLM reads an empty list as "any domain": a name under .invalid (RFC 2606), which never resolves, allows none.
NO_DOMAIN = "no-remote-media.invalid"


def plan_media(domains: list[str]) -> PolicyResult:
    if domains:
        allowed = engine("allowed_media_domains", list(domains), "set by the user (media_domains)", "user")
    else:
        why = "no remote media unless media_domains lists domains (vLLM fetches from any address otherwise: SSRF)"
        allowed = engine("allowed_media_domains", [NO_DOMAIN], why, "policy")
    redirects = env("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0", "a listed domain must not redirect elsewhere", "policy")
    return PolicyResult.of(allowed, redirects)
