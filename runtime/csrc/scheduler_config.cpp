#include "scheduler_config.h"

#include <stdexcept>

namespace dsgraph {
namespace {

constexpr int32_t kMaxNextn = 64;  // a sanity bound; the model's rollback room is the real one

void require_positive(const char *field, int64_t value) {
    if (value <= 0) {
        throw std::invalid_argument(std::string("SchedulerConfig.") + field + " = " + std::to_string(value) +
                                    " is not positive; expected > 0");
    }
}

void check_pages(const SchedulerConfig &c) {
    if (c.num_pages.size() != c.ratios.size()) {
        throw std::invalid_argument("SchedulerConfig.num_pages has " + std::to_string(c.num_pages.size()) +
                                    " entries; expected one per ratio in ratios (" +
                                    std::to_string(c.ratios.size()) + ")");
    }
    for (size_t i = 0; i < c.ratios.size(); ++i) {
        const std::string at = "[" + std::to_string(i) + "]";
        if (c.ratios[i] <= 0 || (i > 0 && c.ratios[i] <= c.ratios[i - 1])) {
            throw std::invalid_argument("SchedulerConfig.ratios" + at + " = " + std::to_string(c.ratios[i]) +
                                        "; expected positive, strictly increasing ratios");
        }
        require_positive(("num_pages" + at).c_str(), c.num_pages[i]);
    }
}

void check_buckets(const SchedulerConfig &c) {
    if (c.buckets.empty()) {
        throw std::invalid_argument("SchedulerConfig.buckets is empty; expected at least one bucket size");
    }
    if (c.buckets.back() < c.max_num_batched_tokens) {
        throw std::invalid_argument(
            "SchedulerConfig.buckets: the largest bucket " + std::to_string(c.buckets.back()) +
            " is below max_num_batched_tokens = " + std::to_string(c.max_num_batched_tokens) +
            "; expected a bucket that fits a full step");
    }
}

void check_verify(const SchedulerConfig &c) {
    if (c.verify_mode == VerifyMode::kOff) {
        return;
    }
    if (c.nextn < 1 || c.nextn > kMaxNextn) {
        throw std::invalid_argument("SchedulerConfig.nextn = " + std::to_string(c.nextn) +
                                    " is outside 1.." + std::to_string(kMaxNextn) + " (verify_mode " +
                                    verify_mode_name(c.verify_mode) + ")");
    }
    if (c.draft_len < 0 || c.draft_len > c.nextn) {
        throw std::invalid_argument("SchedulerConfig.draft_len = " + std::to_string(c.draft_len) +
                                    " is outside 0..nextn = " + std::to_string(c.nextn));
    }
}

}  // namespace

void validate_config(const SchedulerConfig &c) {
    require_positive("max_num_seqs", c.max_num_seqs);
    require_positive("max_num_batched_tokens", c.max_num_batched_tokens);
    require_positive("max_model_len", c.max_model_len);
    require_positive("page_size", c.page_size);
    require_positive("num_slots", c.num_slots);
    if (c.max_num_seqs > c.max_num_batched_tokens) {
        throw std::invalid_argument(
            "SchedulerConfig.max_num_seqs = " + std::to_string(c.max_num_seqs) +
            " exceeds max_num_batched_tokens = " + std::to_string(c.max_num_batched_tokens) +
            "; expected room for one decode row per running request");
    }
    if (c.lookback_len < 0 || c.vocab_size < 0 || c.replay_tokens < 0) {
        const char *field = c.lookback_len < 0 ? "lookback_len"
                            : c.vocab_size < 0 ? "vocab_size"
                                               : "replay_tokens";
        const int32_t value = c.lookback_len < 0 ? c.lookback_len
                              : c.vocab_size < 0 ? c.vocab_size
                                                 : c.replay_tokens;
        throw std::invalid_argument(std::string("SchedulerConfig.") + field + " = " + std::to_string(value) +
                                    " is negative; expected >= 0");
    }
    if (c.ratios.empty()) {
        throw std::invalid_argument(
            "SchedulerConfig.ratios is empty; expected at least one compression ratio");
    }
    check_pages(c);
    check_buckets(c);
    check_verify(c);
}

int32_t pages_needed(int64_t tokens, int32_t ratio, int32_t page_size) {
    const int64_t entries = tokens / ratio;
    return static_cast<int32_t>((entries + page_size - 1) / page_size);
}

int32_t pages_per_seq(const SchedulerConfig &c, int32_t ratio) {
    // Matches CacheGeometry.pages_per_seq: room for ceil(max_model_len / r) entries.
    const int64_t entries = (static_cast<int64_t>(c.max_model_len) + ratio - 1) / ratio;
    return static_cast<int32_t>((entries + c.page_size - 1) / c.page_size);
}

std::string engine_type_name(EngineType type) {
    switch (type) {
        case EngineType::kNormal:
            return "NORMAL";
        case EngineType::kPrompt:
            return "PROMPT";
        case EngineType::kCompletion:
            return "COMPLETION";
    }
    return "?";
}

std::string verify_mode_name(VerifyMode mode) {
    switch (mode) {
        case VerifyMode::kOff:
            return "OFF";
        case VerifyMode::kConfidence:
            return "CONFIDENCE";
        case VerifyMode::kFixed:
            return "FIXED";
    }
    return "?";
}

}  // namespace dsgraph
