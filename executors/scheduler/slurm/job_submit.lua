-- MuxFlow job_submit.lua (installed next to slurm.conf by `muxflow slurm dev-up`; see docs/SLURM.md).
--
-- Every job for the offline partition is held (priority 0) at submission so that Slurm's own
-- scheduler never starts it: MuxFlow imports it (executors/scheduler/slurm/pickup.py), profiles it in its
-- own profiling window and places it on the planned node with --gres=mps:<pct>, and releases it.
-- The job is tagged in admin_comment, which only Slurm's administrators can write. MuxFlow writes
-- its plan (GPU, share, memory quota, xCUDA gains) into the job's comment, signed (executors/scheduler/slurm/
-- plan.py); the root Prolog verifies it before it uses it. A comment that looks like a plan is
-- refused from anyone else, at submission and later (a forged one would not verify anyway).
-- A job without -p goes to the default partition, which is offline on the dev cluster.
--
-- From submission on, such a job is MuxFlow's until it ends or is cancelled: its user cannot
-- change anything of it (partition, GRES/TRES, node lists, comments, hold/release, priority…),
-- and nobody but the releasers (below) can move another job into the offline partition or set a
-- MuxFlow admin comment. Cancelling stays the user's right (scancel is not a modification).
-- Arrays, heterogeneous and multi-node jobs and --no-requeue are refused for the offline
-- partition (the pick-up refuses them too, on a cluster without this script); a job that does
-- not say gets requeue on, whatever the site's JobRequeue.

local OFFLINE = "offline"
local DEFAULT_IS_OFFLINE = true
local TAG = "muxflow"  -- admin_comment prefix of every job MuxFlow manages
-- Who may change MuxFlow's jobs: root, SlurmUser and MuxFlow's own account (an Operator in slurmdbd, through
-- which the dispatcher acts); `dev-up` fills in `[0] = true, [<SlurmUser's uid>] = true, [<MuxFlow's uid>] = true`.
local RELEASERS = { @RELEASER_UIDS@ }

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

local NO_VAL = slurm.NO_VAL or 4294967294
local NO_VAL16 = slurm.NO_VAL16 or 65534

-- MuxFlow gives each offline job its own share of one GPU and moves it by checkpoint and requeue:
-- what cannot be placed or moved that way is refused at submission, with the reason.
local function unplaceable(job_desc)
   if job_desc.array_inx ~= nil then
      return "job arrays are not placed by MuxFlow (each job gets its own GPU share): submit each task as its own job"
   end
   if job_desc.het_job_offset ~= nil and job_desc.het_job_offset ~= NO_VAL then
      return "heterogeneous jobs are not placed by MuxFlow: submit each component as its own job"
   end
   if job_desc.min_nodes ~= nil and job_desc.min_nodes ~= NO_VAL and job_desc.min_nodes > 1 then
      return string.format("MuxFlow places a job on one GPU of one node: -N %d asks for more", job_desc.min_nodes)
   end
   if job_desc.requeue == 0 then
      return "offline jobs are evicted and migrated by checkpoint and requeue: drop --no-requeue"
   end
   return nil
end

local function plan_like(comment)
   return comment ~= nil and string.find(comment, "muxflow-plan=", 1, true) ~= nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.admin_comment ~= nil and not RELEASERS[submit_uid] then
      return refuse("admin_comment is reserved for MuxFlow")
   end
   if plan_like(job_desc.comment) and not RELEASERS[submit_uid] then
      return refuse("a comment with muxflow-plan= is reserved for MuxFlow's plans")
   end
   if is_offline(job_desc.partition) then
      local why = unplaceable(job_desc)
      if why ~= nil then
         return refuse("%s", why)
      end
      if job_desc.requeue == nil or job_desc.requeue == NO_VAL16 then
         job_desc.requeue = 1  -- whatever the site's JobRequeue default: MuxFlow requeues to evict and migrate
      end
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
   if plan_like(job_desc.comment) then
      return refuse("a comment with muxflow-plan= is reserved for MuxFlow's plans")
   end
   return slurm.SUCCESS
end

return slurm.SUCCESS
