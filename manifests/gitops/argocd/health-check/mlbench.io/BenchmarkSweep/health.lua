-- Argo CD health check for mlbench.io/BenchmarkSweep (docs/gitops.md).
-- Installed as argocd-cm's resource.customizations.health.mlbench.io_BenchmarkSweep by the kustomize
-- component next to this folder, which embeds this very file. Argo CD runs it with gopher-lua (Lua 5.1)
-- and the live object in the global `obj`; it must stay valid Lua 5.1 and 5.4 (tests/gitops runs it with
-- lua5.4 over statuses the operator's own planner writes). Without it Argo CD takes a sweep for Healthy
-- as soon as it exists (a kind without a health check is), also one stopped by failurePolicy Stop.
--
--   no status, or metadata.generation not yet observed  -> Progressing (waiting for the operator)
--   condition Stalled=True (a run failed under Stop, a name held by another object, creates refused,
--     an invalid spec)                                   -> Degraded, with the reason and message
--   condition Ready=True (every run finished)            -> Healthy; the message says how many failed
--                                                           (a failed run of a study under Continue is
--                                                           a result; the run itself shows Degraded)
--   anything else                                        -> Progressing: "<status.message>"
local hs = {}

local function nonEmpty(s)
  return s ~= nil and s ~= ""
end

local function condition(status, conditionType)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

local function joined(head, detail)
  if nonEmpty(detail) then
    return head .. ": " .. detail
  end
  return head
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator: the sweep has no status yet"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
local observed = status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = string.format("Waiting for the operator: generation %d not observed yet", generation)
  return hs
end

local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  local reason = "Stalled"
  if nonEmpty(stalled.reason) then
    reason = stalled.reason
  end
  hs.status = "Degraded"
  hs.message = joined(reason, stalled.message)
  return hs
end

local ready = condition(status, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  local failed = tonumber(status.failed) or 0
  local succeeded = tonumber(status.succeeded) or 0
  if failed > 0 then
    hs.message = string.format("Completed: %d runs succeeded, %d failed", succeeded, failed)
  else
    hs.message = string.format("Completed: %d runs succeeded", succeeded)
  end
  return hs
end

hs.status = "Progressing"
hs.message = joined("Progressing", status.message)
return hs
