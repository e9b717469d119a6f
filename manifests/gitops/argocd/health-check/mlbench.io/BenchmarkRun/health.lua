-- Argo CD health check for mlbench.io/BenchmarkRun (docs/gitops.md).
-- Installed as argocd-cm's resource.customizations.health.mlbench.io_BenchmarkRun by the kustomize
-- component next to this folder, which embeds this very file. Argo CD runs it with gopher-lua
-- (Lua 5.1) and the live object in the global `obj`; it must stay valid Lua 5.1 and 5.4
-- (tests/gitops runs it with lua5.4 over testdata/, the cases in health_test.yaml).
--
--   no status, or metadata.generation not yet observed  -> Progressing (waiting for the operator)
--   phase Failed, or condition Stalled=True              -> Degraded, with the reason and message
--   phase Succeeded                                      -> Healthy; the message says whether the
--                                                           accuracy goal was reached (not reaching
--                                                           it is a valid result, not an error)
--   anything else (Pending, Starting, Running)           -> Progressing: "<phase>: <status.message>"
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

local function isTrue(c)
  return c ~= nil and c.status == "True"
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
  hs.message = "Waiting for the operator: the run has no status yet"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
local observed = status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  if observed == nil then
    hs.message = string.format("Waiting for the operator: generation %d not observed yet", generation)
  else
    hs.message = string.format(
      "Waiting for the operator: generation %d not observed yet (status is for generation %d)", generation, observed)
  end
  return hs
end

local failed = condition(status, "Failed")
local stalled = condition(status, "Stalled")
local ready = condition(status, "Ready")

if status.phase == "Failed" then
  -- the failure reason: Failed's, else Stalled's, else Ready's (all three carry it, per the contract)
  local reason = "Failed"
  if isTrue(failed) and nonEmpty(failed.reason) then
    reason = failed.reason
  elseif isTrue(stalled) and nonEmpty(stalled.reason) then
    reason = stalled.reason
  elseif ready ~= nil and ready.status == "False" and nonEmpty(ready.reason) then
    reason = ready.reason
  end
  local message = status.message
  if not nonEmpty(message) and failed ~= nil then
    message = failed.message
  end
  hs.status = "Degraded"
  hs.message = joined(reason, message)
  return hs
end

if isTrue(stalled) then
  -- e.g. NoProgress: Running, but the training step counter stopped moving
  local reason = "Stalled"
  if nonEmpty(stalled.reason) then
    reason = stalled.reason
  end
  hs.status = "Degraded"
  hs.message = joined(reason, stalled.message)
  return hs
end

if status.phase == "Succeeded" then
  local reached = nil
  local detail = nil
  local goal = condition(status, "GoalReached")
  if goal ~= nil and goal.status ~= "Unknown" then
    reached = goal.status == "True"
    detail = goal.message
  elseif status.result ~= nil and status.result.goalReached ~= nil then
    reached = status.result.goalReached
  end
  hs.status = "Healthy"
  if reached == true then
    hs.message = joined("Succeeded, goal reached", detail)
  elseif reached == false then
    hs.message = joined("Succeeded without reaching the goal", detail)
  else
    hs.message = "Succeeded; whether the goal was reached is unknown"
  end
  return hs
end

hs.status = "Progressing"
if nonEmpty(status.phase) then
  hs.message = joined(status.phase, status.message)
else
  hs.message = joined("Waiting for the operator: no phase yet", status.message)
end
return hs
