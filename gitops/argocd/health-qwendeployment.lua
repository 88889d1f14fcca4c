-- Argo CD health check for inference.qwenops.dev/QwenDeployment, read from the status conditions
-- the operator writes. Installed by argocd-cm-patch.yaml next to this file (the same text, inlined).
--   Degraded:    ConfigValid or CapacityFit False (fix the spec), Scheduled False (no GPU node fits),
--                a stuck rollout, or autoscaling that cannot read its metric
--   Progressing: no status yet, a spec generation not yet observed, a rollout, engines loading
--   Healthy:     Ready True and no rollout under way
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function is(kind, status)
  local c = condition(kind)
  return c ~= nil and c.status == status
end

local function message(kind, fallback)
  local c = condition(kind)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

for _, kind in ipairs({"ConfigValid", "CapacityFit", "Scheduled"}) do
  if is(kind, "False") then
    hs.status = "Degraded"
    hs.message = kind .. ": " .. message(kind, "False")
    return hs
  end
end

local progressing = condition("Progressing")
if progressing ~= nil and progressing.status == "False" and progressing.reason == "ProgressDeadlineExceeded" then
  hs.status = "Degraded"
  hs.message = "Rollout stuck: " .. message("Progressing", "progress deadline exceeded")
  return hs
end

if is("ScalingReady", "False") then
  hs.status = "Degraded"
  hs.message = "Autoscaling cannot work: " .. message("ScalingReady", "ScalingReady is False")
  return hs
end

if is("Ready", "True") then
  if is("Progressing", "True") then
    hs.status = "Progressing"
    hs.message = "Serving while rolling out: " .. message("Progressing", "")
    return hs
  end
  hs.status = "Healthy"
  hs.message = message("Ready", "Serving")
  return hs
end

hs.status = "Progressing"
hs.message = message("Ready", "Waiting for an engine replica to become ready")
return hs
