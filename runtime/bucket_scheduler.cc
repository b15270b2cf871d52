// In-order launching of bucket collectives.
#include "runtime/bucket_scheduler.h"

#include "absl/strings/str_cat.h"

namespace zero::runtime {

BucketScheduler::BucketScheduler(int num_buckets, CollectivePath* path, Hooks hooks)
    : entries_(num_buckets), path_(path), hooks_(std::move(hooks)) {}

comm::WorkPtr BucketScheduler::Start(int bucket, const Launch& launch) {
  if (hooks_.before_launch) {
    Status checked = hooks_.before_launch(bucket);
    if (!checked.ok()) return comm::CompletedWork(std::move(checked));
  }
  if (path_ == nullptr) return launch();
  return path_->Start([&launch](comm::Communicator&) { return launch(); });
}

Status BucketScheduler::Reset() {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        in_flight_.size(), " bucket collective(s) still in flight (first: bucket ",
        in_flight_.front().bucket, ")"));
  }
  for (Entry& e : entries_) e = Entry{};
  next_ = 0;
  return absl::OkStatus();
}

Status BucketScheduler::MarkReady(int bucket, Launch launch, Finish finish) {
  if (bucket < 0 || bucket >= static_cast<int>(entries_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket, " does not exist"));
  }
  Entry& entry = entries_[bucket];
  if (entry.ready) {
    return absl::FailedPreconditionError(absl::StrCat("bucket ", bucket, " was already marked ready"));
  }
  entry = Entry{true, std::move(launch), std::move(finish)};
  while (next_ < static_cast<int>(entries_.size()) && entries_[next_].ready) {
    Entry& e = entries_[next_];
    if (e.launch) {
      if (hooks_.on_launch) hooks_.on_launch(next_);
      in_flight_.push_back({next_, Start(next_, e.launch), std::move(e.finish)});
    } else if (e.finish) {
      ZERO_RETURN_IF_ERROR(e.finish());
    }
    ++next_;
  }
  return absl::OkStatus();
}

Status BucketScheduler::WaitOldest(double timeout_s) {
  if (in_flight_.empty()) return absl::FailedPreconditionError("no bucket collective in flight");
  Flight flight = std::move(in_flight_.front());
  in_flight_.pop_front();
  auto what = [describe = hooks_.describe, bucket = flight.bucket] {
    return describe ? describe(bucket) : absl::StrCat("bucket ", bucket);
  };
  if (path_ != nullptr) {
    ZERO_RETURN_IF_ERROR(path_->WaitOnStream(flight.work, what));
  } else {
    const Status status = flight.work->Wait(timeout_s);
    if (!status.ok()) return Status(status.code(), absl::StrCat(what(), ": ", status.message()));
  }
  return flight.finish ? flight.finish() : absl::OkStatus();
}

Status BucketScheduler::WaitAll(double timeout_s) {
  while (!in_flight_.empty()) ZERO_RETURN_IF_ERROR(WaitOldest(timeout_s));
  return absl::OkStatus();
}

}  // namespace zero::runtime
