-- MuxFlow job_submit.lua (installed next to slurm.conf by `muxflow slurm dev-up`; see docs/SLURM.md).
--
-- Every job for the offline partition is held (priority 0) at submission so that Slurm's own
-- scheduler never starts it: MuxFlow imports it (executors/slurm/pickup.py), places it on the
-- planned node with --gres=mps:<pct> and releases it. The job is tagged in admin_comment.
-- A job without -p goes to the default partition, which is offline on the dev cluster.

local OFFLINE = "offline"
local DEFAULT_IS_OFFLINE = true
-- Who may release a held offline job: root and SlurmUser (slurmrestd over the unix socket runs
-- as SlurmUser; `dev-up` fills in its uid).
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

function slurm_job_submit(job_desc, part_list, submit_uid)
   if is_offline(job_desc.partition) then
      job_desc.priority = 0
      job_desc.admin_comment = "muxflow:held-for-placement"
      slurm.log_info("muxflow: held offline job %s from uid %u for placement",
                     tostring(job_desc.name), submit_uid)
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   -- `scontrol release` / `hold: false` set a non-zero priority: only MuxFlow may do that to a
   -- held offline job (it places it first).
   if is_offline(job_rec.partition) and job_rec.priority == 0 and job_desc.priority ~= nil
      and job_desc.priority ~= 0 and job_desc.priority ~= slurm.NO_VAL and not RELEASERS[modify_uid] then
      slurm.log_user("offline jobs wait for MuxFlow to place them; they cannot be released by hand")
      return slurm.ERROR
   end
   return slurm.SUCCESS
end

return slurm.SUCCESS
