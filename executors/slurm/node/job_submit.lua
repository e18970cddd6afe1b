-- MuxFlow job_submit.lua (installed next to slurm.conf by `muxflow slurm dev-up`; see docs/SLURM.md).
--
-- Every job for the offline partition is held (priority 0) at submission so that Slurm's own
-- scheduler never starts it: MuxFlow imports it (executors/slurm/pickup.py), places it on the
-- planned node with --gres=mps:<pct> and releases it. The job is tagged in admin_comment, which
-- only Slurm's administrators can write; MuxFlow later puts its plan there (GPU, share, memory
-- quota, xCUDA gains) and the root Prolog reads it from there.
-- A job without -p goes to the default partition, which is offline on the dev cluster.
--
-- From submission on, such a job is MuxFlow's until it ends or is cancelled: its user cannot
-- change anything of it (partition, GRES/TRES, node lists, comments, hold/release, priority…),
-- and nobody but root and SlurmUser can move another job into the offline partition or set a
-- MuxFlow admin comment. Cancelling stays the user's right (scancel is not a modification).

local OFFLINE = "offline"
local DEFAULT_IS_OFFLINE = true
local TAG = "muxflow"  -- admin_comment prefix of every job MuxFlow manages
-- Who may change MuxFlow's jobs: root and SlurmUser (the dispatcher acts as SlurmUser through
-- slurmrestd; `dev-up` fills in its uid).
local RELEASERS = { [0] = true, [@SLURM_USER_UID@] = true }

local function is_offline(part)
   if part == nil or part == "" then
      return DEFAULT_IS_OFFLINE
   end
   for p in string.gmatch(part, "[^,]+") do
      if p == OFFLINE then
         return true
      end
   end
   return false
end

local function managed(job_rec)
   local tag = job_rec.admin_comment
   return tag ~= nil and string.sub(tag, 1, #TAG) == TAG
end

local function refuse(fmt, ...)
   slurm.log_user(fmt, ...)
   return slurm.ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.admin_comment ~= nil and not RELEASERS[submit_uid] then
      return refuse("admin_comment is reserved for MuxFlow")
   end
   if is_offline(job_desc.partition) then
      job_desc.priority = 0
      job_desc.admin_comment = TAG .. ":held-for-placement"
      slurm.log_info("muxflow: held offline job %s from uid %s for placement",
                     tostring(job_desc.name), tostring(submit_uid))
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if RELEASERS[modify_uid] then
      return slurm.SUCCESS
   end
   if managed(job_rec) then
      slurm.log_info("muxflow: refused uid %s's change to job %s", tostring(modify_uid), tostring(job_rec.job_id))
      return refuse("job %s is placed by MuxFlow: it cannot be changed by hand (scancel still works)",
                    tostring(job_rec.job_id))
   end
   if job_desc.partition ~= nil and is_offline(job_desc.partition) then
      return refuse("jobs enter the offline partition at submission only (sbatch -p %s)", OFFLINE)
   end
   if job_desc.admin_comment ~= nil then
      return refuse("admin_comment is reserved for MuxFlow")
   end
   return slurm.SUCCESS
end

return slurm.SUCCESS
